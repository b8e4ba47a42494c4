"""Where a training run's wall time went, from the workers' span files (the run report's profile).

    profile = run_profile(settings.home / "telemetry", run_id, started_at, ended_at)
    profile.segments        # {"learner": s, "evaluation": s, ...}: an exclusive split of wall_s

Reads the spans every worker's JSONL exporter wrote (`<home>/telemetry/*.jsonl` and their rotated
parts `*.jsonl.1`, see `infra.telemetry_files`) inside the run's time window, and turns them into
intervals:

  learner      `learner.train_step` spans of the run
  inference    `model.generate` spans of training requests: the inference engine had one of
               the run's rollouts (or another run's) to work on
  sandbox      `sandbox.run` spans of training: model-written code running
  activities   any other activity span of the run: waiting for a batch slot, store reads and
               writes, rewards, prepare_run
  evaluation   activity spans (`RunActivity:*`) of the run's held-out evaluation workflows
               (`contracts.names.evaluates`), their `model.generate` and `sandbox.run` spans
               among them

Each instant of the window goes to the first of these that is active (`segments`, in that
order), and what none covers is `temporal`: workflow tasks, scheduling, polling, start-up and
idle waits. It is a lower bound of what Temporal costs a run: one rollout's wait on Temporal is
hidden whenever another's span is open (two rollouts each waiting half their time, interleaved,
give `temporal` 0). What orchestration costs a rollout is `bench/orchestration.py`'s to
measure. Training comes before evaluation: an evaluation that rides along with the rollouts
(at a lower priority, as the default's does) counts only where it holds the run up on its own,
such as the final one; a `model.generate` or `sandbox.run` span is an evaluation's when its
parent span is one of the evaluation's activities. `busy` is each category's own active time
(they overlap: inference and sandboxes run side by side), and `inference_idle_s` the window
minus the time the engine had any request, training or evaluation.

An activity span is the run's by its workflow id (`of_run`), as contracts/names.py names a
run's workflows: `train-<run>`, `train-<run>-learner` (its learner), `<run>-task-<task>` (its
rollouts) and `<run>-eval-v<N>-<task>` (its evaluations' tasks).

Not covered: a run whose id is another's, `-task-` and more (run `a-task-b`'s rollouts,
`a-task-b-task-<task>`, read as run `a`'s too: a task id may hold `-task-`); a setup that
exports to an OTLP collector instead of files (no spans here: the
profile is empty and says so); spans still in a worker's export buffer when the run ends (the
exporters flush every few seconds); spans a worker wrote before its newest two files (each
rotated at `ROTATE_BYTES`), which leaves early parts of a long run on a busy worker out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from contracts.names import evaluates, learner_workflow_id, run_workflow_id, task_workflow_id

Interval = tuple[float, float]
ORDER = ("learner", "inference", "sandbox", "activities", "evaluation")
"""Categories in the order an instant is attributed (the first active one takes it): training's
before evaluation's."""
EVALUATION_CHILDREN = ("inference", "sandbox")
"""Categories whose span is the evaluation's when its parent is one of the evaluation's activities
(the work it waited on)."""


class RunProfile(BaseModel):
    """Where a run's wall time went (seconds)."""

    wall_s: float = Field(description="The run's window.")
    segments: dict[str, float] = Field(
        description="An exclusive split of wall_s: ORDER's categories, then `temporal`."
    )
    busy: dict[str, float] = Field(description="Each category's own active time (overlapping).")
    inference_idle_s: float = Field(
        description="wall_s minus the time the inference engine had a request (of any kind)."
    )
    spans: int = Field(description="Spans read inside the window.")


def run_profile(telemetry_dir: Path, run_id: str, started: float, ended: float) -> RunProfile:
    """The profile of run `run_id` over [started, ended] (Unix seconds)."""
    window = (started, max(ended, started))
    intervals: dict[str, list[Interval]] = {name: [] for name in ORDER}
    spans = list(_spans(telemetry_dir, window))
    categories = [_category(span, run_id) for span in spans]
    evaluations = {
        span.get("span_id")
        for span, category in zip(spans, categories, strict=True)
        if category == "evaluation" and span.get("span_id")
    }
    engine: list[Interval] = []  # every request the engine had, training or evaluation
    for span, category in zip(spans, categories, strict=True):
        if category is None:
            continue
        start = float(span["start"])
        interval = (start, start + float(span["duration_ms"]) / 1000)
        if category == "inference":
            engine.append(interval)
        if category in EVALUATION_CHILDREN and span.get("parent_id") in evaluations:
            category = "evaluation"
        intervals[category].append(interval)
    wall = window[1] - window[0]
    unions = {name: _union(_clip(found, window)) for name, found in intervals.items()}
    segments: dict[str, float] = {}
    left = [window]
    for name in ORDER:
        taken = _intersect(unions[name], left)
        segments[name] = _length(taken)
        left = _subtract(left, taken)
    segments["temporal"] = _length(left)
    return RunProfile(
        wall_s=round(wall, 2),
        segments={k: round(v, 2) for k, v in segments.items()},
        busy={k: round(_length(v), 2) for k, v in unions.items()},
        inference_idle_s=round(wall - _length(_union(_clip(engine, window))), 2),
        spans=sum(category is not None for category in categories),
    )


def _category(span: dict[str, Any], run_id: str) -> str | None:
    name, attrs = str(span.get("name", "")), span.get("attrs") or {}
    if name.startswith("RunActivity:"):
        workflow = str(attrs.get("temporalWorkflowID", ""))
        if evaluates(workflow, run_id):
            return "evaluation"
        return "activities" if of_run(workflow, run_id) else None
    if name == "learner.train_step":
        return "learner" if attrs.get("tempered.run_id") in (None, run_id) else None
    return {"model.generate": "inference", "sandbox.run": "sandbox"}.get(name)


def of_run(workflow: str, run_id: str) -> bool:
    """Whether workflow id `workflow` is one of run `run_id`'s training workflows: the run's, its
    learner's or a rollout's (exactly: run `r2`'s are not run `r`'s)."""
    run = run_workflow_id(run_id)
    rollouts = task_workflow_id(run_id, "")
    return workflow in (run, learner_workflow_id(run)) or workflow.startswith(rollouts)


def _spans(telemetry_dir: Path, window: Interval) -> Iterator[dict[str, Any]]:
    """Span records of every JSONL file that overlap `window` (metric lines are skipped)."""
    paths = [*telemetry_dir.glob("*.jsonl.1"), *telemetry_dir.glob("*.jsonl")]
    for path in sorted(paths) if telemetry_dir.is_dir() else []:
        try:
            if path.stat().st_mtime < window[0]:
                continue  # last written before the run began
            lines = path.open(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue  # renamed or dropped by a rotation since the glob
        with lines:
            for line in lines:
                if not line.startswith('{"kind":"span"'):
                    continue
                try:
                    span = json.loads(line)
                except ValueError:
                    continue  # a line being written
                start = float(span.get("start") or 0)
                if (
                    start < window[1]
                    and start + float(span.get("duration_ms") or 0) / 1000 > window[0]
                ):
                    yield span


def _clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    return [(max(a, window[0]), min(b, window[1])) for a, b in intervals if b > a]


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _intersect(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """Both sorted and disjoint."""
    out: list[Interval] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """xs minus ys (ys ⊆ xs, both sorted and disjoint)."""
    out: list[Interval] = []
    for a, b in xs:
        cursor = a
        for c, d in ys:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                out.append((cursor, c))
            cursor = max(cursor, d)
        if cursor < b:
            out.append((cursor, b))
    return out


def _length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)
