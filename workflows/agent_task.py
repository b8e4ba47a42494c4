"""`AgentTaskWorkflow`: one task rolled out as a GRPO group of G episodes, step by step.

    INIT      open_sessions     `workspace`: a session per episode, on one sandbox worker
    GENERATE  generate          every acting episode's model turn (queue `inference`)
    EXECUTE   execute           `code`: run the programs against the tests (queue `sandbox`)
              env_step          `workspace`: run the tool calls, on the sessions' worker queue
    FEEDBACK  (here)            record the steps; end submitted/solved episodes
    ...       GENERATE again    until every episode ended, the step budget or an abort
    FEEDBACK  verify_episodes   `workspace`: score the final workspaces (hidden tests)
              close_sessions    best effort (also on failure and cancellation; a TTL reaps
                                the rest)
              write_trajectories  one trajectory per episode, once (queue `rewards`), in parts
                                of whole episodes within a payload each
    DONE                        once they are written (a task that fails is never DONE)

Each phase is one batched activity over the group's acting episodes. An episode ends on
`submit` (or, for `code`, tests passing), at the step budget (`max_turns`), when its next prompt
would not fit the context budget (`context_budget`, reported by GENERATE: ended and recorded,
never cut), or on abort. The bookkeeping is `workflows/episodes.py`, the activities' requests
`workflows/requests.py`; the moves are checked against `workflows/fsm.py`.

Sessions are sticky (`workflows/sessions.py`): a step goes to the task queue of the sandbox
worker that holds its session; if that worker is gone or lost the session, the sessions are
restored from their last snapshots elsewhere and the step runs again there, recorded once.

Temporal limits: payloads are references, tool calls and small records, so a step of a group
adds about 15 events and a few kB per episode: a 50-step group of G=8 writing a 360-byte file
every step measured 782 events and 1.7 MiB (tests/workflows/test_episodes.py), 1.5% and 3.5%
of the 51,200-event / 50 MB history limits, so no continue-as-new is needed: a new task of
more than `MAX_GROUP_STEPS` episode-steps (G × max_turns), whose history would pass a quarter
of those limits at worst, fails at its start (`TASK_SIZE_PATCH`; a new run is refused before).

Visibility: `TemperedState` is upserted on the moves a task waits in (INIT for `workspace`,
GENERATE, EXECUTE, and FEEDBACK once its episodes ended, while a `workspace` group is verified
and the trajectories are written) and at DONE once they are written, with the turn, best reward
and tool calls so far; a step's FEEDBACK runs within one workflow task, so its figures ride on
the next move's upsert (`status` shows it). Before `CODE_FEEDBACK_PATCH` a `code` task showed
EXECUTE while it wrote. A task that fails or is cancelled upserts nothing more: it shows the
state it was in, and Temporal's execution status says how it ended (the design has no state for
it). The `status` query answers within a payload (`EpisodeGroup.summaries`).

It is the one workflow that runs by the thousand, so it runs outside the SDK's sandbox (which
re-imports the workflow's modules for every run): `bench/orchestration.py` measured the Temporal
share of rollout wall time at 10.8% unsandboxed vs 15.8% sandboxed. Determinism is guarded by
the code itself (contracts and pure functions only) and by the recorded-history replay tests;
a `code` task issues exactly the commands it issued before workspaces existed.

Start one without Python (see README):
    temporal workflow start --task-queue agent-tasks --type AgentTaskWorkflow --input '{"task": …}'
"""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from contracts.common import ObjectRef, describe_validation_error
    from contracts.episode import EnvStepOutcome, EpisodeEnd
    from contracts.errors import ErrorType, fail
    from contracts.names import Activity, Queue, SearchAttr, Signal
    from contracts.rollout import (
        AgentTaskResult,
        EpisodeState,
        GenerateResponse,
        TaskStatus,
        WriteTrajectoriesResponse,
    )
    from contracts.sandbox import ExecuteOutcome, ExecuteResponse
    from contracts.task import AgentTaskInput, EnvName, TaskSpec, group_steps_problem
    from workflows.activity_options import activity_options, programs_work
    from workflows.episodes import EpisodeGroup
    from workflows.fsm import State, advance, after_feedback
    from workflows.requests import (
        execute_request,
        generate_request,
        write_trajectories_parts,
        write_trajectories_request,
    )
    from workflows.search import search_attribute_updates, task_memo, task_start_options
    from workflows.sessions import Sessions

M = TypeVar("M", bound=BaseModel)
"""The contract a workflow's input is parsed as (`parse_workflow_input`)."""
ABORTED_BY_SIGNAL = "aborted by signal"
"""Why a task aborted by an `abort` signal without a reason (no input, or not text) ended."""

FEWER_WRITES_PATCH = "tempered-task-fewer-writes"
"""Marks runs that upsert once per visible move (GENERATE, EXECUTE, DONE) and take their memo
from the start when it is there. The previous release also upserted at FEEDBACK, in the same
workflow task as the next move, and always upserted its memo: each is an event and a
visibility write (bench/orchestration.py: all upserts together are a quarter of the dev
server's CPU per task). The patch's marker costs two events per task: once no run of the
previous release is left, `workflow.deprecate_patch` ends that."""
DONE_WHEN_WRITTEN_PATCH = "tempered-task-done-when-written"
"""Marks runs that move to DONE (and upsert it, with the rewards) once the trajectories are
written; until then a `workspace` task shows FEEDBACK (upserted while it is verified), and one
that fails keeps showing the state it failed in. Before, DONE was upserted before
`verify_episodes` and `write_trajectories` ran: a task that failed in either showed DONE in the
UI, in search and in its `status` query. Its marker comes when the episodes have ended."""
TRAJECTORY_PARTS_PATCH = "tempered-task-trajectories-in-parts"
"""Marks runs that write their trajectories in parts within a payload each
(`write_trajectories_parts`); its marker comes only with a group that needs more than one.
Before, one request carried every step of the group: past 2 MiB the SDK refused it on every
retry of the workflow task, and the task hung at DONE."""

TASK_SIZE_PATCH = "tempered-task-size-bounded"
"""Marks tasks of more than `MAX_GROUP_STEPS` episode-steps, failed at their start as invalid
(`group_steps_problem`); asked only of such a task, so a task within the bound records nothing,
and one started before the bound (valid then) replays as it ran."""

TESTS_CHECKED_PATCH = "tempered-task-tests-checked"
"""Marks tasks whose tests break `TaskSpec.load_problem` (hidden tests with no top-level assert,
or an entry point and no `check(candidate)`), failed at their start as invalid naming the field:
a task started by hand is checked as task files are where they load. Asked only of such a task,
so a good task records nothing, and a broken one started before (retried for ever in `execute`,
or DONE with every program failed) replays as it ran. Only tests within `CHECKED_TESTS_CHARS`
are checked here (`tests_problem`)."""
CHECKED_TESTS_CHARS = 64 * 1024
"""A task's tests, hidden tests and helpers together past this are not checked at its start: the
check parses them (`ast`, no I/O), about a microsecond a character holding the GIL, tens of
microseconds for a task's few kB, and a workflow activation that takes 2 s (with the others the
worker runs at once) fails as a deadlock, retried for ever (1.5 MB of tests did). Broken hidden
tests past it still fail the task, at its first `execute` (non-retryable `InvalidInput`)."""

CODE_FEEDBACK_PATCH = "tempered-task-code-feedback-shown"
"""Marks `code` runs that upsert FEEDBACK (with their last step's figures) as they start writing
their trajectories, in the workflow task that schedules the write, as a `workspace` run does
before it verifies. Before, their last upsert before DONE was EXECUTE: search showed EXECUTE
while they wrote, and the `status` query FEEDBACK. One upsert (an event and a visibility write)
and the marker's event more per `code` task."""


def parse_workflow_input(model: type[M], what: str, raw: Any, extra: tuple[Any, ...]) -> M:
    """A workflow's one input (`raw`, and `extra`: those past it) as `model`, validated.
    Anything else fails the workflow at once (`InvalidTask`, never retried) saying what is wrong:
    no input or null, one that is not a JSON object, more than one, a field at fault. Its run
    method takes `raw: Any = None, *extra: Any` so that the SDK hands every input over as it
    decoded it (a JSON object as a dict) rather than fail the workflow task, for ever, decoding
    or calling it (`temporal workflow start --input '"hello"'`, no `--input`, two)."""
    name = model.__name__
    if extra:
        problem = f"{len(extra) + 1} inputs, where the workflow takes one {name}"
    elif raw is None:
        problem = f"no input, where the workflow takes one {name} (a JSON object)"
    elif isinstance(raw, model):
        return raw
    elif not isinstance(raw, dict):
        got = type(raw).__name__
        problem = f"the input is a {got}, where the workflow takes one {name} (a JSON object)"
    else:
        try:
            return model.model_validate(raw)
        except ValidationError as err:
            problem = describe_validation_error(err)
    raise fail(ErrorType.INVALID_TASK, f"invalid {what}: {problem}")


def parse_task_input(raw: Any, *extra: Any) -> AgentTaskInput:
    """Validate the workflow input; a bad task fails the workflow (never retried) naming the field."""
    return parse_workflow_input(AgentTaskInput, "task", raw, extra)


def tests_problem(task: TaskSpec) -> str | None:
    """`TaskSpec.load_problem` of a task whose tests are within `CHECKED_TESTS_CHARS`, else None."""
    if len(task.tests) + len(task.hidden_tests) + len(task.helpers) > CHECKED_TESTS_CHARS:
        return None
    return task.load_problem()


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class AgentTaskWorkflow:
    def __init__(self) -> None:
        self._state = State.INIT
        self._turn = 0
        self._group: EpisodeGroup | None = None
        self._policy_version: int | None = None
        self._aborted_reason: str | None = None
        self._published: dict[SearchAttr, object] = {}
        self._lean = False  # FEWER_WRITES_PATCH: set at the start of `run`

    @workflow.run
    async def run(self, raw: Any = None, *extra: Any) -> AgentTaskResult:
        task_input = parse_task_input(raw, *extra)  # any input: see `parse_workflow_input`
        too_large = group_steps_problem(task_input.group_size, task_input.max_turns)
        if too_large and workflow.patched(TASK_SIZE_PATCH):  # asked only of a task too large
            raise fail(ErrorType.INVALID_TASK, f"invalid task: {too_large}")
        broken = tests_problem(task_input.task)
        if broken and workflow.patched(TESTS_CHECKED_PATCH):  # asked only of broken tests
            raise fail(ErrorType.INVALID_TASK, f"invalid task: task.{broken}")
        group = self._group = EpisodeGroup(task_input)
        self._lean = workflow.patched(FEWER_WRITES_PATCH)
        if not (self._lean and "task" in workflow.memo()):  # else the start carried it
            workflow.upsert_memo(task_memo(task_input))
        trajectories = await self._roll_out(task_input, group)  # a failure upserts nothing
        if self._state is not State.DONE:  # DONE_WHEN_WRITTEN_PATCH: DONE once written
            self._move(State.DONE, task_input)
        return group.result(
            self._state.value, trajectories, self._policy_version or 0, self._aborted_reason
        )

    async def _roll_out(self, task_input: AgentTaskInput, group: EpisodeGroup) -> list[ObjectRef]:
        """INIT to the trajectories written; the task is DONE (before `DONE_WHEN_WRITTEN_PATCH`)
        or still in FEEDBACK when they are."""
        sessions = Sessions(task_input, group) if task_input.task.env is EnvName.WORKSPACE else None
        try:
            if sessions is not None:
                self._publish(task_input)  # INIT, while the sessions open
                await sessions.open_first(group.episodes)
            await self._act(task_input, group, sessions)
            when_written = workflow.patched(DONE_WHEN_WRITTEN_PATCH)
            if not when_written:  # histories before it: DONE before the verdicts and writes
                self._move(State.DONE, task_input)
            if sessions is not None:
                if when_written:
                    self._publish(task_input)  # FEEDBACK, while the verifier runs
                await sessions.verify()
                if not when_written:
                    self._publish(task_input)  # the verdicts' rewards
            elif when_written and workflow.patched(CODE_FEEDBACK_PATCH):
                self._publish(task_input)  # FEEDBACK, while the trajectories are written
        finally:  # on DONE, failure and cancellation alike
            if sessions is not None:
                await sessions.close()
        return await self._write(task_input, group)

    async def _write(self, task_input: AgentTaskInput, group: EpisodeGroup) -> list[ObjectRef]:
        """One trajectory per episode, in parts of whole episodes within a payload each, one
        after the other (`TRAJECTORY_PARTS_PATCH`, asked only when the group needs parts)."""
        requests = write_trajectories_parts(task_input, group.episodes)
        if len(requests) > 1 and not workflow.patched(TRAJECTORY_PARTS_PATCH):
            requests = [write_trajectories_request(task_input, group.episodes)]
        trajectories: list[ObjectRef] = []
        for request in requests:
            written = await workflow.execute_activity(
                Activity.WRITE_TRAJECTORIES.value,
                request,
                result_type=WriteTrajectoriesResponse,
                **activity_options(Activity.WRITE_TRAJECTORIES, task_input.heartbeat_timeout_s),
            )
            trajectories += written.trajectories
        return trajectories

    @workflow.query(name="status")
    def status(self) -> TaskStatus:
        """The state, and every episode with its steps; a group whose steps would not fit a
        payload shows each episode's figures and latest steps (`EpisodeGroup.summaries`)."""
        return TaskStatus(
            state=self._state.value,
            turn=self._turn,
            policy_version=self._policy_version,
            samples=self._group.summaries() if self._group else [],
            aborted_reason=self._aborted_reason,
        )

    @workflow.signal(name=Signal.ABORT)
    def abort(self, reason: Any = None, *_: Any) -> None:
        """Stop after the current step (the circuit breaker, or an operator). Any input, as for
        `run`: without one (or with anything but non-empty text), `ABORTED_BY_SIGNAL`; inputs
        past the first are ignored (before, each failed every later workflow task)."""
        why = reason if isinstance(reason, str) and reason else ABORTED_BY_SIGNAL
        self._aborted_reason = self._aborted_reason or why

    async def _act(
        self, task_input: AgentTaskInput, group: EpisodeGroup, sessions: Sessions | None
    ) -> None:
        """GENERATE → EXECUTE → FEEDBACK until every episode ended, out of steps, or aborted."""
        # no bound of its own: `after_feedback` leads to DONE at step max_turns - 1 at the latest
        for step in itertools.count():
            self._turn = step
            self._move(State.GENERATE, task_input)
            generated = await self._generate(task_input, group.acting())
            self._move(State.EXECUTE, task_input)
            outcomes = await self._execute(task_input, generated, sessions)
            self._move(State.FEEDBACK, task_input, publish=False)
            group.feedback(step, generated, outcomes)
            self._trip_breaker(task_input, group)
            next_state = after_feedback(
                all_ended=group.all_ended(),
                turn=step,
                max_turns=task_input.max_turns,
                aborted=self._aborted_reason is not None,
            )
            if next_state is State.DONE:
                aborted = self._aborted_reason is not None
                group.end_acting(EpisodeEnd.ABORTED if aborted else EpisodeEnd.STEP_BUDGET)
            if not self._lean:  # else this step's rewards ride on the next move's upsert
                self._publish(task_input)
            if next_state is State.DONE:
                return

    async def _generate(
        self, task_input: AgentTaskInput, acting: list[EpisodeState]
    ) -> GenerateResponse:
        response = await workflow.execute_activity(
            Activity.GENERATE.value,
            generate_request(task_input, self._turn, acting),
            result_type=GenerateResponse,
            **activity_options(Activity.GENERATE, task_input.heartbeat_timeout_s),
        )
        self._policy_version = response.policy_version
        return response

    async def _execute(
        self, task_input: AgentTaskInput, generated: GenerateResponse, sessions: Sessions | None
    ) -> dict[int, ExecuteOutcome] | dict[int, EnvStepOutcome]:
        if not generated.completions:  # every acting episode hit the context budget
            return {}
        if sessions is not None:
            return await sessions.step(self._turn, generated)
        request = execute_request(task_input, self._turn, generated.completions)
        executed = await workflow.execute_activity(
            Activity.EXECUTE.value,
            request,
            result_type=ExecuteResponse,
            **activity_options(
                Activity.EXECUTE, task_input.heartbeat_timeout_s, work=programs_work(request)
            ),
        )
        return {o.sample: o for o in executed.outcomes}

    def _trip_breaker(self, task_input: AgentTaskInput, group: EpisodeGroup) -> None:
        """Abort once `abort_after` runs hit the time or memory limit (0 = never)."""
        if not task_input.abort_after or self._aborted_reason is not None:
            return
        failures = group.resource_failures()
        if failures >= task_input.abort_after:
            self._aborted_reason = (
                f"circuit breaker: {failures} runs hit timeout or memory_exceeded "
                f"(threshold {task_input.abort_after})"
            )

    def _move(self, target: State, task_input: AgentTaskInput, publish: bool = True) -> None:
        self._state = advance(self._state, target)
        if publish:
            self._publish(task_input)

    def _publish(self, task_input: AgentTaskInput) -> None:
        """Upsert the search attributes that changed since the last upsert (one event)."""
        group = self._group
        assert group is not None
        current = {
            SearchAttr.STATE: self._state.value,
            SearchAttr.TURN: self._turn,
            SearchAttr.REWARD: group.best_reward(),
            SearchAttr.POLICY_VERSION: self._policy_version,
            SearchAttr.TASK_ID: task_input.task.id,
            SearchAttr.RUN_ID: task_input.run_id,
            SearchAttr.TOOL_CALLS: group.tool_calls(),
        }
        changed = {k: v for k, v in current.items() if self._published.get(k) != v}
        self._published.update(changed)
        if updates := search_attribute_updates(changed):
            workflow.upsert_search_attributes(updates)


CANCELLED_WITH_RUN_PATCH = "tempered-task-cancelled-with-its-run"
"""Marks runs whose agent-task children are cancelled when the run closes (cancelled, failed,
terminated, timed out: `ParentClosePolicy.REQUEST_CANCEL`), so each closes its workspace sessions
(`finally: sessions.close()`). Before, the default (TERMINATE) ended them where they stood, and
their sessions held a uid slot and a tmpfs each until the sandbox worker's TTL reaped them. A run
closes with children in flight only when it ends early: it drains them before it continues as new
or completes."""


async def run_agent_task(task_input: AgentTaskInput, workflow_id: str) -> AgentTaskResult:
    """Run one agent task as a child of the calling workflow (a training or evaluation task),
    cancelled if the caller closes before it ends (`CANCELLED_WITH_RUN_PATCH`)."""
    closing = workflow.ParentClosePolicy.TERMINATE  # the SDK's default
    if workflow.patched(CANCELLED_WITH_RUN_PATCH):
        closing = workflow.ParentClosePolicy.REQUEST_CANCEL
    return await workflow.execute_child_workflow(
        AgentTaskWorkflow.run,
        task_input,
        id=workflow_id,
        task_queue=Queue.AGENT_TASKS.value,
        parent_close_policy=closing,
        **task_start_options(task_input),
    )
