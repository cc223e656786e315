"""`python -m bench [--json] [name...]`: run the benchmarks and print their figures.

A benchmark is a module `bench/bench_<name>.py` with `run() -> Figures`; with
no names every one runs, in name order.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import Figure, Figures, Table

PREFIX = "bench_"


def available() -> list[str]:
    """Names of the benchmarks in this package (`bench_list_jobs` -> `list_jobs`)."""
    here = str(Path(__file__).resolve().parent)
    return sorted(m.name.removeprefix(PREFIX) for m in pkgutil.iter_modules([here])
                  if m.name.startswith(PREFIX))


def _format(value: Figure) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _print_table(name: str, rows: Table) -> None:
    columns = list(dict.fromkeys(c for row in rows.values() for c in row))
    cells = [[name, *columns]] + [[label, *(_format(row[c]) if c in row else "" for c in columns)]
                                  for label, row in rows.items()]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    for line in cells:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True))))


def print_figures(name: str, figures: Figures, seconds: float) -> None:
    print(f"== {name} ({seconds:.1f} s)")
    width = max((len(k) for k, v in figures.items() if not isinstance(v, Mapping)), default=0)
    for key, value in figures.items():
        if isinstance(value, Mapping):
            _print_table(key, value)
        else:
            print(f"  {key.ljust(width)}  {_format(value)}")


def main(argv: list[str] | None = None) -> int:
    names = available()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name",
                        help=f"benchmarks to run (default: all of {', '.join(names)})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}; there are {', '.join(names)}")
    results: dict[str, Any] = {}
    for name in args.names or names:
        module = importlib.import_module(f"bench.{PREFIX}{name}")
        start = time.perf_counter()
        figures: Figures = module.run()
        seconds = time.perf_counter() - start
        if args.json:
            results[name] = {"seconds": round(seconds, 1), **figures}
        else:
            print_figures(name, figures, seconds)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
