"""The platform's records: Redis keys, the store, every compare-and-set
transition of jobs and tasks, accounts, usage, retention, telemetry, and the
task log tree on shared storage.

May import shared.domain and shared.infra; never shared.node or services.
"""
