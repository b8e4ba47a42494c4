"""What the activity tests share about heartbeats: an activity environment whose activity has a
given heartbeat timeout, so that `activities.heartbeat.heartbeating` beats every third of it
(ActivityEnvironment's own activity has none, and beats every `MAX_EVERY_S`)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio.testing import ActivityEnvironment


def timing_out_after(seconds: float | None) -> ActivityEnvironment:
    """An activity environment whose activity has a heartbeat timeout of `seconds`."""
    env = ActivityEnvironment()
    timeout = None if seconds is None else timedelta(seconds=seconds)
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timeout)
    return env
