"""A scripted episode driver: fixed tool calls played through the session activities.

    result = await client.execute_workflow(ScriptedEpisodes.run, DriverInput(...), ...)
    result = await drive_plain(activities, DriverInput(...))     # the same, without Temporal

`ScriptedEpisodes` does what AgentTaskWorkflow's episodes do with their sandbox sessions, minus
the model: open_sessions on `sandbox`; each step on the queue of the worker holding the sessions,
with a schedule-to-start timeout; when that worker is gone, open_sessions restores the last
snapshots on another worker and the step runs again (recorded once); verify; close.
`drive_plain` calls the same activity methods directly (bench/episodes.py compares the two).
Used by tests/test_sessions_crash.py and bench/episodes.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.common import Contract
from contracts.episode import (
    CloseSessionsRequest,
    CloseSessionsResponse,
    EnvStepItem,
    EnvStepRequest,
    EnvStepResponse,
    OpenSessionsRequest,
    OpenSessionsResponse,
    SessionRef,
    ToolCall,
    VerifyItem,
    VerifyRequest,
    VerifyResponse,
)
from contracts.names import Activity, Queue
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec

DRIVER_QUEUE = "episode-driver"


R = TypeVar("R")
Call = Callable[[Activity, Contract, type[Any], str, float | None], Awaitable[Any]]
"""How `play` runs an activity: (activity, request, result type, queue, schedule-to-start)."""


class DriverInput(Contract):
    run_id: str
    task_id: str
    workspace: WorkspaceSpec
    script: list[dict[int, ToolCall]]
    """Step → sample → call."""
    heartbeat_s: float = 10.0
    session_timeout_s: float = 5.0


class StepRecord(Contract):
    step: int
    sample: int
    queue: str
    observation: str
    tree_digest: str


class DriverResult(Contract):
    digests: dict[int, str]
    history: list[StepRecord]
    restores: int
    scores: dict[int, float]


class WorkerLost(Exception):
    """A step's worker is gone: restore its sessions elsewhere."""


async def play(
    job: DriverInput, call: Call, on_step: Callable[[int], None] = lambda _: None
) -> DriverResult:
    """The episodes of `job`: open, every step (restoring lost sessions), verify, close."""
    samples = sorted(job.script[0])
    sessions = await _open(job, call, samples, {})
    history: list[StepRecord] = []
    restores = 0
    for step, calls in enumerate(job.script):
        on_step(step)
        while True:
            items = [
                EnvStepItem(sample=s, session=sessions[s], completion=sessions[s].snapshot, call=c)
                for s, c in calls.items()
            ]
            request = EnvStepRequest(
                run_id=job.run_id,
                task_id=job.task_id,
                step=step,
                env=EnvName.WORKSPACE,
                items=items,
            )
            try:
                done: EnvStepResponse = await call(
                    Activity.ENV_STEP,
                    request,
                    EnvStepResponse,
                    sessions[samples[0]].queue,
                    job.session_timeout_s,
                )
                break
            except WorkerLost:
                restores += 1
                sessions = await _open(
                    job, call, samples, {s: sessions[s].snapshot for s in samples}
                )
        for outcome in done.outcomes:
            sessions[outcome.sample] = outcome.session
            history.append(StepRecord(step=step, sample=outcome.sample, queue=outcome.session.queue,
                                      observation=outcome.observation.sha256, tree_digest=outcome.session.tree_digest))  # fmt: skip
    verify = VerifyRequest(
        run_id=job.run_id, task_id=job.task_id, env=EnvName.WORKSPACE, workspace=job.workspace,
        items=[VerifyItem(sample=s, snapshot=sessions[s].snapshot) for s in samples],
    )  # fmt: skip
    verdicts: VerifyResponse = await call(
        Activity.VERIFY_EPISODES, verify, VerifyResponse, Queue.SANDBOX.value, None
    )
    close = CloseSessionsRequest(session_ids=[sessions[s].session_id for s in samples])
    await call(
        Activity.CLOSE_SESSIONS,
        close,
        CloseSessionsResponse,
        sessions[samples[0]].queue,
        job.session_timeout_s,
    )
    return DriverResult(
        digests={s: sessions[s].tree_digest for s in samples},
        history=history,
        restores=restores,
        scores={v.sample: v.score for v in verdicts.verdicts},
    )


async def _open(
    job: DriverInput, call: Call, samples: list[int], snapshots: dict[int, Any]
) -> dict[int, SessionRef]:
    request = OpenSessionsRequest(
        run_id=job.run_id, task_id=job.task_id, env=EnvName.WORKSPACE, workspace=job.workspace,
        samples=samples, snapshots=snapshots, limits=SandboxLimits(),
    )  # fmt: skip
    opened: OpenSessionsResponse = await call(
        Activity.OPEN_SESSIONS, request, OpenSessionsResponse, Queue.SANDBOX.value, None
    )
    return opened.sessions


@workflow.defn(name="ScriptedEpisodes", sandboxed=False)
class ScriptedEpisodes:
    """`play` through Temporal: every activity on its task queue, lost workers detected by the
    step's schedule-to-start timeout."""

    def __init__(self) -> None:
        self.step = -1

    @workflow.query(name="step")
    def current_step(self) -> int:
        return self.step

    @workflow.run
    async def run(self, job: DriverInput) -> DriverResult:
        async def call(
            activity: Activity,
            request: Contract,
            result: type[Any],
            queue: str,
            start_s: float | None,
        ) -> Any:
            options: dict[str, Any] = {
                "task_queue": queue,
                "start_to_close_timeout": timedelta(minutes=5),
                "heartbeat_timeout": timedelta(seconds=job.heartbeat_s),
                "retry_policy": RetryPolicy(
                    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5)
                ),
            }
            if start_s is not None:
                options["schedule_to_start_timeout"] = timedelta(seconds=start_s)
            try:
                return await workflow.execute_activity(
                    activity.value, request, result_type=result, **options
                )
            except ActivityError as error:
                cause = error.cause
                if isinstance(cause, TimeoutError) and cause.type is TimeoutType.SCHEDULE_TO_START:
                    raise WorkerLost from error
                raise

        def on_step(step: int) -> None:
            self.step = step

        return await play(job, call, on_step)


async def drive_plain(activities: EnvironmentActivities, job: DriverInput) -> DriverResult:
    """`play` without Temporal: the same activity methods, called directly."""
    methods: dict[Activity, Any] = {
        Activity.OPEN_SESSIONS: activities.open_sessions,
        Activity.ENV_STEP: activities.env_step,
        Activity.VERIFY_EPISODES: activities.verify_episodes,
        Activity.CLOSE_SESSIONS: activities.close_sessions,
    }
    environment = ActivityEnvironment()

    async def call(
        activity: Activity, request: Contract, result: type[Any], queue: str, start_s: float | None
    ) -> Any:
        return await environment.run(methods[activity], request)

    return await play(job, call)
