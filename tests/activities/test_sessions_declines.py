"""A restore of sessions this worker lost (`OpenSessionsRequest.lost_on` names its queue) is
declined, retryably and after a short delay, until the open has waited `lost_on_wait_s` since
it was first scheduled (the server's two times); then, or when another worker is named, the
sessions open here. Real bwrap sessions and a real SeaweedFS (fixtures: test_environment.py);
the workflow side: tests/workflows/test_sessions_broken_host_restore.py."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.environment import DECLINED_RETRY_S, EnvironmentActivities
from contracts.episode import OpenSessionsRequest
from contracts.errors import ErrorType
from contracts.task import EnvName
from tests.activities.test_environment import QUEUE, RUN, TASK, acts, spec  # noqa: F401 (a fixture)
from tests.infra.environments.conftest import needs_root

pytestmark = [needs_root, pytest.mark.asyncio]


def restore(lost_on: list[str]) -> OpenSessionsRequest:
    return OpenSessionsRequest(
        run_id=RUN, task_id=TASK.spec.id, env=EnvName.WORKSPACE, workspace=spec(), samples=[0],
        snapshots={0: spec().files}, lost_on=lost_on, lost_on_wait_s=30.0,
    )  # fmt: skip


def waited(seconds: float) -> ActivityEnvironment:
    """An attempt scheduled `seconds` after the activity's first schedule."""
    environment = ActivityEnvironment()
    first = environment.info.scheduled_time
    environment.info = dataclasses.replace(
        environment.info,
        attempt=2,
        current_attempt_scheduled_time=first + timedelta(seconds=seconds),
    )
    return environment


async def test_the_worker_that_lost_them_declines_their_restore(
    acts: EnvironmentActivities,  # noqa: F811
) -> None:
    with pytest.raises(ApplicationError) as declined:
        await waited(29.5).run(acts.open_sessions, restore(["sandbox-a", QUEUE]))
    error = declined.value
    assert error.type == ErrorType.SANDBOX_INFRA and not error.non_retryable
    assert error.next_retry_delay == timedelta(seconds=DECLINED_RETRY_S)
    assert QUEUE in str(error) and acts.host.sessions == {}


async def test_it_opens_them_once_the_open_has_waited(
    acts: EnvironmentActivities,  # noqa: F811
) -> None:
    opened = await waited(30.0).run(acts.open_sessions, restore([QUEUE]))
    assert opened.sessions[0].queue == QUEUE and list(acts.host.sessions) == [
        opened.sessions[0].session_id
    ]


async def test_another_worker_named_opens_them_at_once(
    acts: EnvironmentActivities,  # noqa: F811
) -> None:
    opened = await waited(0.0).run(acts.open_sessions, restore(["sandbox-elsewhere-7"]))
    assert opened.sessions[0].queue == QUEUE


async def test_a_request_naming_no_worker_is_sent_as_before() -> None:
    """Without `lost_on` the fields are left out: a worker of an older build, which forbids
    fields it does not know, still takes the open."""
    plain = json.loads(restore([]).model_dump_json())
    assert "lost_on" not in plain and "lost_on_wait_s" not in plain
    named = json.loads(restore(["sandbox-a"]).model_dump_json())
    assert named["lost_on"] == ["sandbox-a"] and named["lost_on_wait_s"] == 30.0
    assert OpenSessionsRequest.model_validate(named) == restore(["sandbox-a"])
