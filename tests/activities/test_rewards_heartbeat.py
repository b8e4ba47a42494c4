"""write_trajectories heartbeats while it reads and assembles the episodes and while it writes
them, as every activity that can outlast its heartbeat timeout does (activities/heartbeat.py).

It heartbeated once, between the two: a group whose reads (every step's completion record,
parsed) or writes took longer than the heartbeat timeout was retried elsewhere while it ran,
and again. Reads and writes are slowed here; no store is called.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.rewards import RewardActivities
from contracts.common import ObjectRef
from contracts.episode import EpisodeEnd
from contracts.rollout import EpisodeState, WriteTrajectoriesRequest
from contracts.task import TaskSpec

TASK = TaskSpec(id="add", prompt="Write add(a, b).", entry_point="add", tests="assert True")
SLOW_S = 0.6
"""How long each read-and-assemble, and each write, takes here: two heartbeat intervals."""
HEARTBEAT_TIMEOUT = timedelta(seconds=0.9)


@pytest.mark.asyncio
async def test_it_heartbeats_while_it_assembles_and_while_it_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beats: list[Any] = []
    during: dict[str, list[int]] = {"assemble": [], "write": []}

    def slow(phase: str, result: Any) -> Any:
        before = len(beats)
        time.sleep(SLOW_S)  # in its thread: the activity's loop runs on
        during[phase].append(len(beats) - before)
        return result

    def assemble(self: RewardActivities, req: Any, index: int, episode: EpisodeState) -> Any:
        return slow("assemble", episode.sample)

    def write_once(
        self: RewardActivities, run_id: str, sample: int, episode: EpisodeState
    ) -> tuple[ObjectRef, bool]:
        ref = ObjectRef(key=f"trajectories/{sample}.json", size=1, sha256="0" * 64)
        return slow("write", (ref, True))

    monkeypatch.setattr(RewardActivities, "_assemble", assemble)
    monkeypatch.setattr(RewardActivities, "_write_once", write_once)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=HEARTBEAT_TIMEOUT)
    env.on_heartbeat = lambda *details: beats.append(details)
    samples = [EpisodeState(sample=s, end=EpisodeEnd.SUBMITTED, solved=True) for s in range(2)]
    req = WriteTrajectoriesRequest(run_id="run-hb", task=TASK, group_size=2, samples=samples)
    done = await env.run(RewardActivities(None).write_trajectories, req)  # type: ignore[arg-type]
    assert done.created == 2
    # a beat every third of the timeout (0.3 s): at least one in each 0.6 s phase
    assert min(during["assemble"]) >= 1 and min(during["write"]) >= 1, during
