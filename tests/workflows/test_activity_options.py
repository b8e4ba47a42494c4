"""The activity table's timeouts against the limits they must outlast (workflows/activity_options.py)."""

from __future__ import annotations

from datetime import timedelta

import annotated_types
import pytest

from contracts.names import Activity
from contracts.task import SandboxLimits
from workflows.activity_options import activity_options


@pytest.mark.parametrize("kind", [Activity.EXECUTE, Activity.ENV_STEP, Activity.VERIFY_EPISODES])
def test_a_program_allowed_the_longest_limit_can_finish(kind: Activity) -> None:
    """At 20 minutes, a program allowed its hour (SandboxLimits.timeout_s ≤ 3600) was cut by
    Temporal at every attempt, and retried without end."""
    (bound,) = [m.le for m in SandboxLimits.model_fields["timeout_s"].metadata
                if isinstance(m, annotated_types.Le)]  # fmt: skip
    start_to_close = activity_options(kind, 30.0)["start_to_close_timeout"]
    assert start_to_close >= timedelta(seconds=float(bound)) + timedelta(minutes=30)
