"""The requests `AgentTaskWorkflow` sends its activities, built from the task's input and its
group's episodes: one home for what each request carries.

    generate_request(task_input, turn, group.acting())            # GENERATE
    execute_request(task_input, turn, generated.completions)      # EXECUTE, `code`
    open_sessions_request(task_input, workspace, episodes)        # INIT (or a restore), `workspace`
    for items in env_step_parts(group.episodes, completions):     # EXECUTE, one part a worker
        env_step_request(task_input, step, items)
    verify_request(task_input, workspace, group.episodes)         # DONE, with the untouched tree
    sessions_by_queue(group.episodes)                             # DONE: what to close, where
    write_trajectories_parts(task_input, group.episodes)          # DONE, within a payload each

Pure functions of contracts (no I/O, no clock, no randomness), so workflow code calls them and
a replay builds the same requests; the benches' plain loops (bench/episodes_agent.py,
bench/orchestration.py) call them too, so both sides of a bench send the same requests. What
they do not do: send anything, or pick a queue, timeout or retry (workflows/activity_options.py,
workflows/sessions.py), or decide which episodes act (workflows/episodes.py).

`EPISODES_BYTES` is the one bound on the episodes one payload carries (a `write_trajectories`
part here, the `status` query in `EpisodeGroup.summaries`), measured by `json_bytes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel
from pydantic_core import to_json
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.common import ObjectRef
    from contracts.episode import (
        EnvStepItem,
        EnvStepRequest,
        OpenSessionsRequest,
        VerifyItem,
        VerifyRequest,
    )
    from contracts.errors import ErrorType, fail
    from contracts.rollout import (
        Completion,
        EpisodeState,
        GenerateItem,
        GenerateRequest,
        WriteTrajectoriesRequest,
    )
    from contracts.sandbox import ExecuteItem, ExecuteRequest
    from contracts.task import AgentTaskInput, WorkspaceSpec
    from workflows.budget import PAYLOAD_LIMIT

EPISODES_BYTES = PAYLOAD_LIMIT // 4 - 16 * 1024
"""The most a payload of a group's episodes holds as JSON (a `write_trajectories` request, the
`status` query's answer): below the SDK's warning at a quarter of Temporal's 2 MiB bound (512
KiB, TMPRL1103 logged for every larger payload), less room for the payload's metadata and the
answer's other fields. At about 1 KB a step, a group's steps passed the whole bound at 2,150
episode-steps (G=16 at 140 steps, G=128 at 20): one request then hung the task."""


Item = TypeVar("Item", bound=BaseModel)


def json_bytes(model: BaseModel) -> int:
    """The size of `model` as a payload's JSON (UTF-8): what the data converter writes."""
    return len(to_json(model))


def in_parts(items: Sequence[Item], room: int) -> list[list[Item]]:
    """`items` in parts of consecutive whole items, in order, each part's items `room` bytes of
    JSON at most with their commas (`json_bytes`; an item larger than that goes alone): one
    part when they all fit. The one packing rule of what must fit a payload (a group's
    trajectories, a learner step's groups)."""
    parts: list[list[Item]] = []
    size = 0
    for item in items:
        item_bytes = json_bytes(item) + 1  # and its comma
        if parts and size + item_bytes <= room:
            parts[-1].append(item)
            size += item_bytes
        else:
            parts.append([item])
            size = item_bytes
    return parts


def generate_request(
    task_input: AgentTaskInput, turn: int, acting: Sequence[EpisodeState]
) -> GenerateRequest:
    """GENERATE of `turn`: each acting episode continues from its last completion and
    observation (none at turn 0)."""
    task = task_input.task
    return GenerateRequest(
        run_id=task_input.run_id,
        task_id=task.id,
        turn=turn,
        env=task.env,
        prompt=task.prompt,
        sampling=task_input.sampling,
        max_context_tokens=task_input.max_context_tokens,
        policy_run=task_input.policy_run or task_input.run_id,
        policy_version=task_input.policy_version,
        max_turns=task_input.max_turns,
        items=[
            GenerateItem(
                sample=e.sample,
                previous=e.steps[-1].completion if e.steps else None,
                observation=e.steps[-1].observation if e.steps else None,
            )
            for e in acting
        ],
    )


def execute_request(
    task_input: AgentTaskInput, turn: int, completions: Sequence[Completion]
) -> ExecuteRequest:
    """EXECUTE of a `code` task at `turn`: the completions' programs (those that had code)
    against the task's tests, helpers and hidden tests."""
    task = task_input.task
    return ExecuteRequest(
        run_id=task_input.run_id,
        task_id=task.id,
        turn=turn,
        tests=task.tests,
        entry_point=task.entry_point,
        helpers=task.helpers,
        hidden_tests=task.hidden_tests,
        limits=task_input.limits,
        items=[
            ExecuteItem(sample=c.sample, code=c.code) for c in completions if c.code is not None
        ],
    )


def open_sessions_request(
    task_input: AgentTaskInput,
    workspace: WorkspaceSpec,
    episodes: Sequence[EpisodeState],
    restore: bool = False,
    lost_on: Sequence[str] = (),
) -> OpenSessionsRequest:
    """A session per episode, fresh from `workspace`, or (`restore`) from the last snapshot of
    each episode that had a session; `lost_on`: the queues of the workers that lost them, which
    decline the restore for the task's `session_timeout_s`."""
    snapshots: dict[int, ObjectRef] = {}
    if restore:
        snapshots = {e.sample: e.session.snapshot for e in episodes if e.session}
    return OpenSessionsRequest(
        run_id=task_input.run_id,
        task_id=task_input.task.id,
        env=task_input.task.env,
        workspace=workspace,
        samples=[e.sample for e in episodes],
        snapshots=snapshots,
        limits=task_input.limits,
        lost_on=list(lost_on),
        lost_on_wait_s=task_input.session_timeout_s if lost_on else 0.0,
    )


def env_step_parts(
    episodes: Sequence[EpisodeState], completions: Sequence[Completion]
) -> list[list[EnvStepItem]]:
    """The completions' tool calls as env_step items, one part per worker queue holding their
    sessions (in the order the queues first appear). A completion without a session or a call
    is a bad input: GENERATE answers only acting episodes of a `workspace` task."""
    by_queue: dict[str, list[EnvStepItem]] = defaultdict(list)
    for c in completions:
        session = episodes[c.sample].session
        if session is None or c.call is None:
            raise fail(ErrorType.INVALID_INPUT, f"sample {c.sample}: no session or no call")
        by_queue[session.queue].append(
            EnvStepItem(sample=c.sample, session=session, completion=c.completion, call=c.call)
        )
    return list(by_queue.values())


def env_step_request(
    task_input: AgentTaskInput, step: int, items: list[EnvStepItem]
) -> EnvStepRequest:
    """EXECUTE of a `workspace` task at `step`: one worker's part (`env_step_parts`)."""
    return EnvStepRequest(
        run_id=task_input.run_id,
        task_id=task_input.task.id,
        step=step,
        env=task_input.task.env,
        limits=task_input.limits,
        items=items,
    )


def verify_request(
    task_input: AgentTaskInput,
    workspace: WorkspaceSpec,
    episodes: Sequence[EpisodeState],
    untouched: bool = True,
) -> VerifyRequest:
    """DONE: the final snapshot of each episode that had a session and (`untouched`) the task's
    untouched workspace beside them, as sample `len(episodes)`, which rewards are measured from."""
    items = [
        VerifyItem(sample=e.sample, snapshot=e.session.snapshot)
        for e in episodes
        if e.session is not None
    ]
    if untouched:
        items.append(VerifyItem(sample=len(episodes), snapshot=workspace.files))
    return VerifyRequest(
        run_id=task_input.run_id,
        task_id=task_input.task.id,
        env=task_input.task.env,
        workspace=workspace,
        limits=task_input.limits,
        items=items,
    )


def sessions_by_queue(episodes: Sequence[EpisodeState]) -> dict[str, list[str]]:
    """The episodes' open session ids, by the worker queue that holds them (close_sessions)."""
    by_queue: dict[str, list[str]] = defaultdict(list)
    for e in episodes:
        if e.session is not None:
            by_queue[e.session.queue].append(e.session.session_id)
    return dict(by_queue)


def write_trajectories_request(
    task_input: AgentTaskInput, episodes: list[EpisodeState]
) -> WriteTrajectoriesRequest:
    """DONE: one trajectory per episode of `episodes` (the group, or a part of it)."""
    return WriteTrajectoriesRequest(
        run_id=task_input.run_id,
        task=task_input.task,
        group_size=task_input.group_size,
        samples=episodes,
    )


def write_trajectories_parts(
    task_input: AgentTaskInput, episodes: list[EpisodeState], budget: int = EPISODES_BYTES
) -> list[WriteTrajectoriesRequest]:
    """DONE: the group's trajectories in requests of whole episodes, in sample order, each of
    `budget` bytes at most (one episode larger than that goes alone); one request when the
    whole group fits. Every episode is in exactly one part."""
    room = budget - json_bytes(write_trajectories_request(task_input, []))
    return [write_trajectories_request(task_input, part) for part in in_parts(episodes, room)]
