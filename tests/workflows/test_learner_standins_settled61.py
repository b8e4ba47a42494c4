"""`learner_standins.settled`, which `quiet` waits on before a test terminates a learner: a
workflow whose workflow task is still pending is not settled. On the time-skipping server a
describe never fills `pending_workflow_task` (quiet read it, so it returned while a task was
pending, and the terminate leaked the server's time lock: 31 s of timers ran in real time)."""

from __future__ import annotations

import pytest

from tests.fixtures.learner_standins import settled
from tests.fixtures.temporal import time_skipping_server


@pytest.mark.asyncio
async def test_a_workflow_whose_task_no_worker_took_is_not_settled() -> None:
    async with time_skipping_server() as env:
        handle = await env.client.start_workflow(
            "NobodyRunsThis", id="unsettled", task_queue="no-worker-polls-this"
        )
        raw = (await handle.describe()).raw_description
        assert not raw.HasField("pending_workflow_task")  # what quiet read, and why it failed
        assert not settled(await handle.fetch_history())
        await handle.terminate("test over")
