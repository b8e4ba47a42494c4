"""bench/run_all.py reproduces what the README's table cites and alternates what it measures:
the learner's figures are of "5 steps alternating" while the cited command and `--full` ran
the bench's default 3, and the quick publish (`--versions 2`) measured one version, its
sharded side always first."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _row(start: str) -> list[str]:
    rows = [line for line in README.read_text().splitlines() if line.startswith(f"| {start}")]
    assert len(rows) == 1, f"one README row starts with {start!r}: {len(rows)}"
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


def _steps(flags: list[str]) -> int | None:
    return int(flags[flags.index("--steps") + 1]) if "--steps" in flags else None


def test_the_learner_row_its_command_and_full_run_the_same_steps() -> None:
    from run_all import BENCHES

    _, figure, command = _row("a learner step:")
    cited = re.search(r"(\d+) steps alternating", figure)
    assert cited is not None, figure
    steps = int(cited.group(1))
    assert _steps(BENCHES["learner"]["full"]) == steps
    match = re.fullmatch(r"`python bench/learner\.py (.*)`", command)
    assert match is not None, command
    assert _steps(match.group(1).split()) == steps


def test_quick_runs_measure_both_orders_of_the_sides() -> None:
    from publish import MEASURED_FROM, parse_args, side_order
    from run_all import BENCHES

    versions = parse_args(BENCHES["publish"]["quick"]).versions
    firsts = [side_order(v)[0] for v in range(MEASURED_FROM, versions + 1)]
    assert sorted(set(firsts)) == ["sharded", "whole"], firsts
    steps = _steps(BENCHES["learner"]["quick"])
    assert steps is not None and steps >= 2  # learner.py: step % 2 picks the order
