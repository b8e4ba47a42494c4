"""An `open_sessions` outlasts its wait for a sandbox slot (activities/environment.py).

Every session activity of a worker takes its items' slots from one semaphore
(`EnvironmentActivities._each`, `sandbox.concurrency` wide), inside the activity: a step holds
one up to its command's limit (`SandboxLimits.timeout_s` ≤ 3600 s), a verify up to its checks'.
The open's start-to-close was 10 minutes: an open queued behind them timed out, closed the
sessions it had opened, and was retried at the back of the queue, where it timed out again.
It heartbeats while it waits (`heartbeating_each`), so a dead worker is still found at once.
"""

from __future__ import annotations

from datetime import timedelta

import annotated_types

from contracts.names import Activity
from contracts.task import SandboxLimits
from workflows.activity_options import activity_options


def start_to_close(kind: Activity) -> timedelta:
    timeout: timedelta = activity_options(kind, 30.0)["start_to_close_timeout"]
    return timeout


def test_an_open_outlasts_the_longest_hold_of_the_slots_it_waits_for() -> None:
    metadata = SandboxLimits.model_fields["timeout_s"].metadata
    (bound,) = [m.le for m in metadata if isinstance(m, annotated_types.Le)]
    longest = timedelta(seconds=float(str(bound)))  # SandboxLimits.timeout_s's bound
    opens = start_to_close(Activity.OPEN_SESSIONS)
    for holder in (Activity.ENV_STEP, Activity.VERIFY_EPISODES):
        assert opens >= start_to_close(holder), holder
    assert opens >= longest + timedelta(minutes=30)
