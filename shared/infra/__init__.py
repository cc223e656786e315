"""What every service stands on: settings, logging, the clock of this host,
the Celery app and its messages, Redis connections and failover, credentials,
supervision of worker processes, link-safe file walks.

May import shared.domain only.
"""
