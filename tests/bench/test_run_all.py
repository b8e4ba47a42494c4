"""bench/run_all.py (`make bench`): every bench, and a summary that never passes an old entry off
as this run's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

NOT_BENCHES = {"common", "run_all", "trl_side", "task_parent", "episodes_agent", "episodes_common"}
"""Helpers of the benches, not benches."""


def test_run_all_runs_every_bench() -> None:
    from run_all import BENCHES

    scripts = {p.stem for p in BENCH.glob("*.py")} - NOT_BENCHES
    assert sorted(BENCHES) == sorted(scripts)


def test_its_full_vs_trl_is_the_comparison_the_readme_cites() -> None:
    """README: `python bench/vs_trl.py --full` (vs_trl.FULL: eval every 2 steps among them)."""
    from run_all import BENCHES

    assert BENCHES["vs_trl"]["full"] == ["--full"]


ORCHESTRATION = {
    "tempered_rollouts_per_s": 7.0,
    "plain_rollouts_per_s": 8.0,
    "temporal_share": 0.125,
    "workflows_per_s": 1.75,
    "server_cpu_s_per_workflow": 0.1,
    "path": "children of a parent workflow",
    "machine": {"load_average": [0.3, 0.4, 0.5]},
}


def test_the_summary_marks_what_this_run_did_not_measure_as_stale() -> None:
    from run_all import summary

    started = datetime(2026, 12, 6, 22, 0, tzinfo=UTC)
    results = {
        "orchestration": {**ORCHESTRATION, "measured_at": "2026-12-06T22:05:00+0000"},
        "decode": {"runs": [], "measured_at": "2026-12-06T21:00:00+0000"},
        "learner": {"speedup": 1.4, "machine": {"measured_at": "2026-12-05T10:00:00+0000"}},
    }
    lines = summary(results, started, ["orchestration", "decode", "learner", "prefix"])
    assert lines[0].startswith("orchestration: 7.0 vs 8.0 rollouts/s"), lines
    assert lines[1:] == [
        "decode: stale (measured 2026-12-06T21:00:00+0000)",
        "learner: stale (measured 2026-12-05T10:00:00+0000)",
        "prefix: no entry",
    ]
