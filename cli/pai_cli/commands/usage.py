"""pai usage: GPU-, CPU- and memory-hours used, per user, VC, day or job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.table import Table

from pai_cli.session import Session, console, output_option, pass_session, print_json
from pai_cli.views import usage_table, user_budgets_table

DIMENSIONS = ("day", "user", "vc", "job")


def usage_params(by: Sequence[str], first: str | None, last: str | None, user: str | None,
                 vc: str | None, output: str) -> dict[str, Any]:
    """The query GET /api/v1/usage is sent (unset options are left to the API)."""
    return {"groupBy": ",".join(by or ("user",)), "from": first, "to": last, "user": user,
            "vc": vc, "format": "csv" if output == "csv" else None}


@click.command()
@click.option("--by", "-b", "by", multiple=True, type=click.Choice(DIMENSIONS),
              help="Group by this (repeat for several: -b day -b user) [default: user].")
@click.option("--from", "first", metavar="YYYY-MM-DD",
              help="First UTC day [default: 29 days before --to].")
@click.option("--to", "last", metavar="YYYY-MM-DD", help="Last UTC day [default: today].")
@click.option("--vc", metavar="VC", help="Only this virtual cluster's usage.")
@click.option("--user", "-u", "user", metavar="USER",
              help="Only USER's usage (admins; everyone else sees their own).")
@click.option("--budget", is_flag=True,
              help="Show users' own GPU-hour budgets within VCs (yours; an admin: everyone's) "
                   "and what each spent this period, instead.")
@output_option("table", "json", "csv")
@pass_session
def usage(session: Session, by: tuple[str, ...], first: str | None, last: str | None,
          vc: str | None, user: str | None, budget: bool, output: str) -> None:
    """GPU-hours (and CPU- and memory-hours) used, from placement to exit.

    \b
    Running tasks count up to now. Admins see everyone, others their own:
      pai usage                       per user, the last 30 days
      pai usage -b vc -b day          per VC and day
      pai usage -o csv > usage.csv    for chargeback
      pai usage --budget              your budgets within VCs, spent so far
    """
    if budget and output == "csv":
        raise click.UsageError("--budget shows a table or JSON, not CSV")
    answer = session.client().call("GET", "/api/v1/usage", params=usage_params(
        by, first, last, user or session.user, vc, output))
    if budget:
        budgets = answer.get("budgets") or []
        if output == "json":
            print_json(budgets)
        else:
            console().print(user_budgets_table(budgets) if budgets
                            else "no per-user GPU-hour budget")
    elif output == "csv":
        click.echo(answer, nl=False)
    elif output == "json":
        print_json(answer)
    else:
        console().print(_table(answer))
        if answer.get("trimmed"):
            console().print(f"(usage before {answer.get('retainedFrom')} is no longer kept)")


def _table(answer: Mapping[str, Any]) -> Table | str:
    if not answer.get("rows"):
        return f"no usage from {answer.get('from')} to {answer.get('to')}"
    return usage_table(answer["rows"], answer.get("groupBy") or [])
