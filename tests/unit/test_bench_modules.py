"""`python -m bench` runs every `bench/bench_<name>.py` by its `run()`: a module
of that name without one stops `make bench` at it, after all the others ran."""

from __future__ import annotations

import importlib
import inspect

import pytest

from bench.__main__ import PREFIX, available


def test_there_are_benchmarks() -> None:
    assert {"api_submit", "short_jobs", "task_samples"} <= set(available())


@pytest.mark.parametrize("name", available())
def test_each_benchmark_has_a_run_without_arguments(name: str) -> None:
    module = importlib.import_module(f"bench.{PREFIX}{name}")
    run = getattr(module, "run", None)
    assert callable(run), f"bench/{PREFIX}{name}.py has no run()"
    assert not inspect.signature(run).parameters
