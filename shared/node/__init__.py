"""A node's runtime: the Docker engine, task containers' names and labels,
and NVML.

May import shared.domain and shared.infra; never shared.state or services
(a node's services reach the records through shared.state themselves).
"""
