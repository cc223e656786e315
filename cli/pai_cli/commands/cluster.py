"""pai nodes, pai vcs: what the cluster has and who uses it."""

from __future__ import annotations

import click

from pai_cli.formatting import now_ms
from pai_cli.session import Session, console, output_option, pass_session, print_json
from pai_cli.views import nodes_table, vcs_table


@click.command()
@output_option()
@pass_session
def nodes(session: Session, output: str) -> None:
    """List the nodes: state, GPUs, CPUs and memory in use, heartbeat."""
    rows = session.client().call("GET", "/api/v1/nodes")
    if output == "json":
        print_json(rows)
    elif not rows:
        console().print("no nodes have registered")
    else:
        console().print(nodes_table(rows, now_ms()))


@click.command()
@output_option()
@pass_session
def vcs(session: Session, output: str) -> None:
    """List the virtual clusters: quotas, use, running and waiting jobs."""
    found = session.client().call("GET", "/api/v1/virtual-clusters")
    if output == "json":
        print_json(found)
    else:
        console().print(vcs_table(found))
