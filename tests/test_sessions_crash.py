"""Workspace sessions survive a SIGKILLed sandbox worker, and dead workers leave nothing behind.

Real processes: `tempered up` (Temporal dev server + SeaweedFS), two `tempered worker sandbox`
processes, and in this process a small scripted driver workflow that plays fixed tool calls
through the session activities exactly as an episode does (open_sessions on `sandbox`, each
step on the queue of the worker holding its sessions with a schedule-to-start timeout, a lost
worker → open_sessions restores the last snapshots elsewhere and the step runs again).

- `test_a_killed_worker_loses_no_step`: the worker holding the sessions is SIGKILLed while a
  step runs; the episode completes on the other worker with final tree digests equal to those
  of the same script run without the crash, every step recorded once.
- `test_an_agent_task_survives_a_killed_sandbox_worker`: the same through AgentTaskWorkflow
  itself (GENERATE by a scripted model, tests/workflows/harness.py), the worker killed once the
  server shows it running the long step: the episodes end DONE with the same digests, verdicts
  and rewards as without the crash, each step in the status query once, and the history shows
  that the long step sent to the killed worker's queue timed out or failed (never completed).
- `test_killed_workers_leave_nothing_behind`: a worker is SIGKILLed mid-step three times (a
  new one started each time); then no sandbox process, session directory, cgroup or mount is
  left.

    .venv/bin/pytest -m slow -s tests/test_sessions_crash.py
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from activities.rewards import RewardActivities
from contracts.episode import ToolCall
from contracts.names import Queue
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.task import AgentTaskInput, SamplingParams
from infra.environments.dead_workers import MARKER
from infra.environments.mounts import mounts_under, remove_tree
from infra.sandbox.cgroups import CGROUP_CONTROLLERS, CGROUP_ROOT
from infra.sandbox.workspace import SESSION_UID_BASE, SLOTS
from infra.tasks.workspace import workspace_tasks
from tests.episode_driver import DRIVER_QUEUE, DriverInput, DriverResult, ScriptedEpisodes
from tests.fixtures.history import TemporalView
from tests.fixtures.stack import BIN, Stack
from tests.infra.environments.conftest import needs_root
from tests.workflows.harness import ScriptedModel, connect, running_workers
from workflows.agent_task import AgentTaskWorkflow

pytestmark = [pytest.mark.slow, needs_root]
TASK = workspace_tasks()[20]  # workspace-roman-0
LONG_STEP = 2
"""The step during which the worker is killed: it sleeps, so the kill lands mid-command."""


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


def script() -> list[dict[int, ToolCall]]:
    """Sample 0 fixes the module, sample 1 only takes notes; step 2 sleeps."""
    fix = TASK.spec.canonical_solution or ""
    return [
        {
            0: ToolCall(
                name="write_file", arguments={"path": "notes/plan.txt", "content": "fix it\n"}
            ),
            1: bash("ls > listing.txt"),
        },
        {
            0: bash("python3 test_*.py > before.txt; echo $? >> before.txt"),
            1: ToolCall(name="read_file", arguments={"path": "README.md"}),
        },
        {0: bash("sleep 6; echo slept >> log.txt"), 1: bash("sleep 6; echo slept >> log.txt")},
        {0: bash(fix), 1: ToolCall(error="no tool call in the turn")},
        {
            0: bash("python3 test_*.py > after.txt; echo $? >> after.txt"),
            1: bash("echo done >> log.txt"),
        },
        {0: ToolCall(name="submit"), 1: ToolCall(name="submit")},
    ]


class Workers:
    """The test's sandbox worker processes (several at once, unlike `Stack.start_worker`)."""

    def __init__(self, stack: Stack, root: Path) -> None:
        self.stack, self.processes = stack, list[subprocess.Popen[bytes]]()
        self.env = {
            **stack.env,
            "TEMPERED_SANDBOX__WORKSPACES__ROOT": str(root),
            "TEMPERED_SANDBOX__LOCAL__WARM": "0",
        }

    def start(self) -> subprocess.Popen[bytes]:
        log = self.stack.home / f"worker-sandbox-{len(self.processes)}.log"
        with log.open("ab") as output:
            process = subprocess.Popen(
                [str(BIN / "tempered"), "worker", "sandbox"],
                env=self.env,
                stdout=output,
                stderr=output,
            )
        self.processes.append(process)
        self.stack.wait_for(
            "a sandbox worker to poll",
            lambda: "worker ready: queue=sandbox-" in log.read_text(errors="replace"),
            120,
        )
        return process

    def kill(self, pid: int) -> None:
        process = next(p for p in self.processes if p.pid == pid)
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.wait(60)


async def drive(stack: Stack, run_id: str, on_step=None) -> DriverResult:  # type: ignore[no-untyped-def]
    client = await connect(stack.settings.temporal.address, "default")
    assert TASK.spec.workspace is not None
    job = DriverInput(
        run_id=run_id, task_id=TASK.spec.id, workspace=TASK.spec.workspace, script=script()
    )
    async with Worker(client, task_queue=DRIVER_QUEUE, workflows=[ScriptedEpisodes]):
        handle = await client.start_workflow(
            ScriptedEpisodes.run, job, id=f"drive-{run_id}", task_queue=DRIVER_QUEUE
        )
        if on_step is not None:
            await on_step(handle)
        return await handle.result()


def holder_pid(stack: Stack, run_id: str) -> int:
    """The pid of the sandbox worker whose queue the episode's current step went to."""
    described = stack.temporal(
        "workflow", "describe", "--workflow-id", f"drive-{run_id}", "-o", "json"
    )
    pending = json.loads(described.stdout).get("pendingActivities", [])
    queues = [
        a.get("lastWorkerIdentity", "")
        for a in pending
        if a.get("activityType", {}).get("name") == "env_step"
    ]
    assert queues and queues[0], pending
    return int(queues[0].rsplit(":", 1)[1])


def step_running_on(stack: Stack, workflow_id: str, pid: int) -> Callable[[], bool]:
    """Trigger: an `env_step` of `workflow_id` is STARTED by the sandbox worker `pid`."""

    def running() -> bool:
        described = stack.temporal(
            "workflow", "describe", "--workflow-id", workflow_id, "-o", "json"
        )
        return any(
            a.get("activityType", {}).get("name") == "env_step"
            and a.get("state") == "PENDING_ACTIVITY_STATE_STARTED"
            and a.get("lastWorkerIdentity", "").endswith(f":{pid}")
            for a in json.loads(described.stdout or "{}").get("pendingActivities", [])
        )

    return running


def step_ends(stack: Stack, workflow_id: str, queue: str, step: int) -> list[str]:
    """How each `env_step` of `step` scheduled on task queue `queue` ended (COMPLETED,
    TIMED_OUT, FAILED, CANCELED), from the workflow's history."""
    histories = TemporalView(stack.settings.temporal.address).histories()
    (events,) = [events for (w, _), events in histories.items() if w == workflow_id]
    scheduled = set()
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            kind, sent_to = attributes.activity_type.name, attributes.task_queue.name
            request = attributes.input.payloads  # an EnvStepRequest, for env_step
            if (
                kind == "env_step"
                and sent_to == queue
                and json.loads(request[0].data)["step"] == step
            ):
                scheduled.add(event.event_id)
    ends = []
    for event in events:
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_ACTIVITY_TASK_")
        if name in ("COMPLETED", "TIMED_OUT", "FAILED", "CANCELED"):
            attributes = getattr(event, f"activity_task_{name.lower()}_event_attributes")
            if attributes.scheduled_event_id in scheduled:
                ends.append(name)
    return ends


def upload_task(stack: Stack) -> None:
    store = stack.store()
    for key, data in TASK.objects.items():
        store.put_bytes(key, data)


def test_a_killed_worker_loses_no_step(stack: Stack) -> None:
    root = Path(tempfile.mkdtemp(prefix="tempered-crash-sessions-"))
    workers = Workers(stack, root)
    try:
        workers.start()
        workers.start()
        upload_task(stack)
        calm = asyncio.run(drive(stack, "calm"))
        killed: list[int] = []

        async def kill_mid_step(handle) -> None:  # type: ignore[no-untyped-def]
            while await handle.query(ScriptedEpisodes.current_step) < LONG_STEP:
                await asyncio.sleep(0.2)
            await asyncio.to_thread(
                stack.wait_for,
                "the long step to start",
                stack.activity_pending("drive-crash", "env_step"),
                60,
                0.2,
            )
            await asyncio.sleep(2.5)  # inside `sleep 6`
            pid = await asyncio.to_thread(holder_pid, stack, "crash")
            workers.kill(pid)
            killed.append(pid)

        started = time.monotonic()
        crashed = asyncio.run(drive(stack, "crash", kill_mid_step))
        print(f"crash-resume: killed worker {killed}, restores={crashed.restores}, "
              f"episode took {time.monotonic() - started:.1f}s; digests calm={calm.digests} crash={crashed.digests}")  # fmt: skip
        assert killed and crashed.restores == 1
        assert crashed.digests == calm.digests
        assert crashed.scores == calm.scores and calm.scores[0] == 1.0 and calm.scores[1] < 1
        steps = [(r.step, r.sample) for r in crashed.history]
        assert steps == [(r.step, r.sample) for r in calm.history] and len(set(steps)) == len(steps)
        assert [r.observation for r in crashed.history] == [r.observation for r in calm.history]
        before = {r.queue for r in crashed.history if r.step < LONG_STEP}
        after = {r.queue for r in crashed.history if r.step >= LONG_STEP}
        assert len(before) == len(after) == 1 and before != after
        assert str(killed[0]) in before.pop()
    finally:
        workers.stop()
        remove_tree(root)


def leftovers(root: Path, pids: list[int]) -> dict[str, list[Any]]:
    uids = [
        range(SESSION_UID_BASE + pid * SLOTS, SESSION_UID_BASE + (pid + 1) * SLOTS) for pid in pids
    ]
    processes = [
        (p.pid, p.info["name"])
        for p in psutil.process_iter(["uids", "name", "status"])
        if p.info["uids"]
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and any(p.info["uids"].real in r for r in uids)
    ]
    cgroups = [
        path
        for ctl in CGROUP_CONTROLLERS
        for pid in pids
        for path in (CGROUP_ROOT / ctl / "tempered").glob(f"{pid}-w*")
    ]
    return {
        "directories": sorted(p for p in root.iterdir() if p.name != MARKER),  # the root's own
        "processes": processes,
        "cgroups": cgroups,
        "mounts": mounts_under(root),  # workspace tmpfs
    }


def test_killed_workers_leave_nothing_behind(stack: Stack) -> None:
    root = Path(tempfile.mkdtemp(prefix="tempered-leftover-sessions-"))
    workers = Workers(stack, root)
    upload_task(stack)
    killed: list[int] = []
    try:
        worker = workers.start()
        for round_ in range(3):
            run_id = f"round-{round_}-{uuid.uuid4().hex[:6]}"

            async def kill_mid_step(handle, pid: int = worker.pid) -> None:  # type: ignore[no-untyped-def]
                while await handle.query(ScriptedEpisodes.current_step) < LONG_STEP:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2.5)
                workers.kill(pid)
                killed.append(pid)
                await handle.terminate("the test killed its worker")

            with pytest.raises(Exception):  # noqa: B017 - the driver was terminated
                asyncio.run(drive(stack, run_id, kill_mid_step))
            assert any(d.name.startswith(f"{worker.pid}-") for d in root.iterdir())  # it was there
            worker = workers.start()  # sweeps what the dead one left
        workers.stop()
        left = leftovers(root, killed + [worker.pid])
        print(f"leftovers after killing workers {killed}: {left}")
        assert left == {"directories": [], "processes": [], "cgroups": [], "mounts": []}
    finally:
        workers.stop()
        remove_tree(root)


async def agent_task(
    stack: Stack, run_id: str, on_running=None
) -> tuple[AgentTaskResult, TaskStatus]:  # type: ignore[no-untyped-def]
    """The task through AgentTaskWorkflow: this process runs the workflow, the scripted model
    (the script's calls, in the model's tool-call format) and the trajectory writer; the
    sandbox workers are the test's processes."""
    client = await connect(stack.settings.temporal.address, "default")
    store = stack.store()
    steps = script()
    model = ScriptedModel(store, lambda sample, step: steps[step][sample])
    task_input = AgentTaskInput(
        task=TASK.spec, run_id=run_id, group_size=2, max_turns=len(steps),
        sampling=SamplingParams(max_new_tokens=4, stop_after_tool_call=True),
        session_timeout_s=5.0, heartbeat_timeout_s=10.0,
    )  # fmt: skip
    workers = {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        Queue.INFERENCE: {"activities": [model.generate]},
        Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
    }
    async with running_workers(client, workers):  # type: ignore[arg-type]
        handle = await client.start_workflow(
            AgentTaskWorkflow.run,
            task_input,
            id=f"agent-{run_id}",
            task_queue=Queue.AGENT_TASKS.value,
        )
        if on_running is not None:
            await on_running(handle)
        result = await handle.result()
        status = await handle.query(AgentTaskWorkflow.status)
    return result, status


def test_an_agent_task_survives_a_killed_sandbox_worker(stack: Stack) -> None:
    root = Path(tempfile.mkdtemp(prefix="tempered-crash-sessions-"))
    workers = Workers(stack, root)
    try:
        workers.start()
        workers.start()
        upload_task(stack)
        calm, calm_status = asyncio.run(agent_task(stack, "calm"))
        killed: list[int] = []
        queues: list[str] = []  # the killed worker's task queue

        async def kill_mid_step(handle) -> None:  # type: ignore[no-untyped-def]
            while True:
                status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
                if status.turn == LONG_STEP and status.state == "EXECUTE":
                    break
                await asyncio.sleep(0.2)
            session = status.samples[0].session
            assert session is not None
            pid = int(session.queue.rsplit("-", 1)[1])
            running = step_running_on(stack, handle.id, pid)
            await asyncio.to_thread(stack.wait_for, "the long step to run", running, 60, 0.2)
            await asyncio.sleep(1.0)  # inside `sleep 6`
            workers.kill(pid)
            killed.append(pid)
            queues.append(session.queue)

        started = time.monotonic()
        crashed, status = asyncio.run(agent_task(stack, "crash", kill_mid_step))
        digests = {e.sample: e.session.tree_digest for e in status.samples if e.session}
        calm_digests = {e.sample: e.session.tree_digest for e in calm_status.samples if e.session}
        print(f"agent task crash-resume: killed worker {killed}, took {time.monotonic() - started:.1f}s, "
              f"rewards {crashed.rewards} (calm {calm.rewards}), digests equal: {digests == calm_digests}")  # fmt: skip
        assert killed and crashed.state == calm.state == "DONE"
        ends = step_ends(stack, "agent-crash", queues[0], LONG_STEP)
        print(f"the long step on the killed worker's queue ended: {ends}")
        assert ends and set(ends) <= {"TIMED_OUT", "FAILED"}, ends  # the kill hit it
        assert digests == calm_digests
        assert crashed.rewards == calm.rewards and crashed.solved == calm.solved == [True, False]
        for episode in status.samples:
            assert [s.step for s in episode.steps] == list(range(len(script())))
            assert episode.session is not None and str(killed[0]) not in episode.session.queue
        observations = [
            [s.observation.sha256 for s in e.steps if s.observation] for e in status.samples
        ]
        assert observations == [
            [s.observation.sha256 for s in e.steps if s.observation] for e in calm_status.samples
        ]
    finally:
        workers.stop()
        remove_tree(root)
