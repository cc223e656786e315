"""The node agent: one command that runs a node's launcher and monitor."""
