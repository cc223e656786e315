"""The web portal: server-rendered pages over the API, served by the API (docs/portal.md)."""
