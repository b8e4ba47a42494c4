"""A segment of a run started on an earlier release replays on this code, also where its input
(`RunResume.tasks`: the whole suite, carried through every continue-as-new) holds a value a
rule added since refuses in a new run: hidden tests whose asserts are in a loop, which the
previous release took and `hidden_tests_problem` refuses since f927ceb. When `TaskSpec` refused
them on decode, the segment's first workflow task failed ("Failed decoding arguments") and was
retried for ever: the run was stuck. A new task file with them is refused where it loads
(tests/contracts/test_stored_inputs.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from temporalio.client import WorkflowHistory

from tests.workflows.replaying import replay
from tests.workflows.test_replay import HISTORIES, RECORDED
from workflows.training_run import TrainingRunWorkflow

LOOPED = "for case in range(3):\n    assert case < 3\n"


def with_hidden_tests(name: str, hidden: str) -> WorkflowHistory:
    """Recorded history `name`, its first training task's hidden tests in its input `hidden`."""
    history = json.loads((HISTORIES / name).read_text())
    started = history["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = started["input"]["payloads"][0]
    data: dict[str, Any] = json.loads(base64.b64decode(payload["data"]))
    assert data["resume"] is not None, f"{name} is a run's first segment"
    data["resume"]["tasks"]["train"][0]["hidden_tests"] = hidden
    payload["data"] = base64.b64encode(json.dumps(data).encode()).decode()
    return WorkflowHistory.from_json(RECORDED[name][1], history)


@pytest.mark.asyncio
async def test_a_segment_whose_suite_has_hidden_tests_of_the_previous_release_replays() -> None:
    await replay(with_hidden_tests("training_run_tails_next.json", LOOPED), TrainingRunWorkflow)
