"""pai nodes, pai vcs: what the cluster has and who uses it; admins cordon,
drain and uncordon nodes."""

from __future__ import annotations

from typing import Any

import click

from pai_cli.api import node_path
from pai_cli.formatting import now_ms
from pai_cli.session import Session, console, output_option, pass_session, print_json
from pai_cli.views import node_line, nodes_table, vcs_table

# What each admin command asks of PUT /nodes/<name> (docs/nodes.md).
NODE_CHANGES: dict[str, dict[str, bool]] = {
    "cordon": {"schedulable": False},
    "drain": {"drain": True},
    "uncordon": {"schedulable": True},
}


def node_change(action: str, reason: str | None) -> dict[str, Any]:
    """The request body for `pai nodes <action>`: uncordoning takes no reason
    (a schedulable node keeps none)."""
    body: dict[str, Any] = dict(NODE_CHANGES[action])
    if reason is not None and action != "uncordon":
        body["reason"] = reason
    return body


@click.group(invoke_without_command=True)
@output_option()
@pass_session
@click.pass_context
def nodes(ctx: click.Context, session: Session, output: str) -> None:
    """List the nodes: state, GPU model, GPUs used and free, CPUs, memory.

    \b
    Admins take a node out of service and back:
      pai nodes cordon NAME   no new tasks land; running ones finish
      pai nodes drain NAME    also preempt its jobs and requeue them
      pai nodes uncordon NAME back in service (ends a drain)
      pai nodes clear-gpu NAME INDEX  trust a GPU marked unhealthy again
    """
    if ctx.invoked_subcommand is not None:
        return
    rows = session.client().call("GET", "/api/v1/nodes")
    if output == "json":
        print_json(rows)
    elif not rows:
        console().print("no nodes have registered")
    else:
        console().print(nodes_table(rows, now_ms()))


def _node_command(action: str, help_text: str) -> click.Command:
    @click.argument("name")
    @output_option()
    @pass_session
    def change(session: Session, name: str, output: str, reason: str | None = None) -> None:
        node = session.client().call("PUT", node_path(name), body=node_change(action, reason))
        if output == "json":
            print_json(node)
        else:
            click.echo(node_line(node))

    if action != "uncordon":
        change = click.option("--reason", "-r", metavar="TEXT",
                              help="Why, shown with the node to everyone.")(change)
    return click.command(action, help=help_text)(change)


nodes.add_command(_node_command(
    "cordon", "Stop new tasks landing on node NAME; its running tasks finish (admins)."))
nodes.add_command(_node_command(
    "drain", "Cordon node NAME and move its jobs off: they are stopped gracefully "
             "and requeued, not charged a retry (admins)."))
nodes.add_command(_node_command(
    "uncordon", "Put node NAME back in service, ending any drain (admins)."))


@nodes.command("clear-gpu")
@click.argument("name")
@click.argument("index", type=click.IntRange(min=0))
@output_option()
@pass_session
def clear_gpu(session: Session, name: str, index: int, output: str) -> None:
    """Mark GPU INDEX of node NAME healthy again, once it was looked at (admins)."""
    node = session.client().call("DELETE", f"{node_path(name)}/gpus/{index}/fault")
    if output == "json":
        print_json(node)
    else:
        click.echo(f"GPU {index} of node {name} is schedulable again")


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
