"""The checkpoint report line a job prints (shared/domain/checkpoints.py):
exact matches only, since the job's output is untrusted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.checkpoints import PREFIX, checkpoint_step, last_checkpoint_step


@pytest.mark.parametrize(("line", "step"), [
    pytest.param("PAI_CHECKPOINT_STEP=0", 0, id="step zero"),
    pytest.param("PAI_CHECKPOINT_STEP=1200", 1200, id="a step"),
    pytest.param("PAI_CHECKPOINT_STEP=1200   ", 1200, id="trailing spaces kept out"),
    pytest.param("PAI_CHECKPOINT_STEP=000042", 42, id="leading zeros"),
    pytest.param("PAI_CHECKPOINT_STEP=" + "9" * 15, 10**15 - 1, id="fifteen digits"),
    pytest.param("PAI_CHECKPOINT_STEP=" + "9" * 16, None, id="sixteen digits refused"),
    pytest.param("PAI_CHECKPOINT_STEP=", None, id="no number"),
    pytest.param("PAI_CHECKPOINT_STEP=-5", None, id="negative"),
    pytest.param("PAI_CHECKPOINT_STEP=1e9", None, id="exponent"),
    pytest.param("PAI_CHECKPOINT_STEP=12 13", None, id="two numbers"),
    pytest.param("PAI_CHECKPOINT_STEP=١٢", None, id="non-ASCII digits"),
    pytest.param(" PAI_CHECKPOINT_STEP=12", None, id="not at the line's start"),
    pytest.param("step 12: PAI_CHECKPOINT_STEP=12", None, id="inside another line"),
    pytest.param("pai_checkpoint_step=12", None, id="other case"),
    pytest.param("PAI_CHECKPOINT_STEP=12\x1b[2J", None, id="escape codes after it"),
    pytest.param("PAI_CHECKPOINT_STEP=12\n13", None, id="a newline inside"),
    pytest.param("step 100 loss 0.2", None, id="an ordinary line"),
])
def test_report_lines(line: str, step: int | None) -> None:
    assert checkpoint_step(line) == step


def test_a_batch_gives_its_last_report() -> None:
    assert last_checkpoint_step(["step 100", "PAI_CHECKPOINT_STEP=100", "step 200",
                                 "PAI_CHECKPOINT_STEP=200", "PAI_CHECKPOINT_STEP=oops",
                                 "step 300"]) == 200


def test_a_batch_without_reports_gives_none() -> None:
    assert last_checkpoint_step(["step 100", "done"]) is None
    assert last_checkpoint_step([]) is None


@given(st.one_of(st.text(max_size=60), st.text(max_size=30).map(lambda t: PREFIX + t)))
def test_a_step_comes_only_from_the_prefix_and_ascii_digits(line: str) -> None:
    step = checkpoint_step(line)
    if step is not None:
        digits = line[len(PREFIX):].rstrip(" ")
        assert line.startswith(PREFIX)
        assert digits and set(digits) <= set("0123456789") and len(digits) <= 15
        assert int(digits) == step


@given(st.integers(min_value=0, max_value=10**15 - 1))
def test_every_step_in_range_round_trips(step: int) -> None:
    assert checkpoint_step(f"{PREFIX}{step}") == step
