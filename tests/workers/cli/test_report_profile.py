"""The run report's profile: from the workers' span files to report.json's `profile`, the
terminal table and profile.png; none where no worker wrote telemetry here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.settings import Settings
from workers.cli.report import write_profile


@pytest.mark.parametrize("ago", [0, 3600], ids=["just ended", "ended an hour ago"])
def test_the_profile_is_printed_drawn_and_returned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ago: int
) -> None:
    """A run `--attach` reports after it ended unfollowed is profiled over its own window (the
    window ended at the report's writing: an hour on, the profile held none of its spans)."""
    telemetry = tmp_path / "telemetry"
    telemetry.mkdir()
    now = time.time() - ago
    spans = [
        {
            "name": "RunActivity:generate",
            "start": now - 8,
            "duration_ms": 4000,
            "span_id": "a1",
            "attrs": {"temporalWorkflowID": "r-task-x"},
        },
        {
            "name": "model.generate",
            "start": now - 8,
            "duration_ms": 4000,
            "span_id": "g1",
            "parent_id": "a1",  # the run's request: its activity is the run's
            "attrs": {},
        },
        {
            "name": "learner.train_step",
            "start": now - 3,
            "duration_ms": 2000,
            "attrs": {"tempered.run_id": "r"},
        },
    ]
    (telemetry / "inference-1.jsonl").write_text(
        "".join(json.dumps({"kind": "span", **s}, separators=(",", ":")) + "\n" for s in spans)
    )
    profile = write_profile(Settings(home=tmp_path), "r", 10.0, tmp_path, ended=now)
    assert profile["segments"]["inference"] == pytest.approx(4, abs=0.1)
    assert profile["segments"]["learner"] == pytest.approx(2, abs=0.1)
    assert sum(profile["segments"].values()) == pytest.approx(profile["wall_s"], abs=0.05)
    table = capsys.readouterr().out
    assert "inference" in table and "learner" in table and "engine idle" in table
    assert "workers_down" in table and "no worker wrote anything" in table
    assert (tmp_path / "profile.png").stat().st_size > 1000


def test_without_worker_telemetry_here_the_profile_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers that export to an OTLP collector, or run on another machine than `tempered
    train`, leave no span file here: no table of 100% Temporal, no bar, null segments."""
    profile = write_profile(Settings(home=tmp_path), "r", 3600.0, tmp_path, ended=time.time())
    assert profile["segments"] is None and profile["busy"] is None, profile
    assert profile["inference_idle_s"] is None and profile["wall_s"] == 3600
    out = capsys.readouterr().out
    assert "no worker telemetry here" in out and "%" not in out, out  # no shares
    assert not (tmp_path / "profile.png").exists()
