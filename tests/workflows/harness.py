"""Helpers for workflow tests: workers in this process, scripted stand-ins for the model and
for a sandbox worker's workspace sessions.

`start` starts a task's workflow. `ScriptedModel` writes chosen answers where the inference
activity would write sampled ones (token in, token out: each step's prompt extends the previous
prompt and completion).
`ScriptedSandbox` is one "sandbox worker" holding sessions in memory: workspaces are dicts of
files, snapshots are JSON documents in the real store, steps run on its own queue. Temporal and
S3 are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.environment import session_id as real_session_id
from contracts.common import ObjectRef
from contracts.episode import (
    WORKSPACE_TOOLS,
    CloseSessionsRequest,
    CloseSessionsResponse,
    EnvStepOutcome,
    EnvStepRequest,
    EnvStepResponse,
    OpenSessionsRequest,
    OpenSessionsResponse,
    SessionRef,
    ToolCall,
    Verdict,
    VerifyRequest,
    VerifyResponse,
)
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity, Queue
from contracts.rollout import (
    AgentTaskResult,
    Completion,
    CompletionRecord,
    GenerateRequest,
    GenerateResponse,
)
from contracts.sandbox import ExecStatus
from contracts.task import AgentTaskInput, EnvName
from infra import keys
from infra.inference.toolcalls import full_call, parse_tool_call
from infra.storage import ObjectStore
from tests.infra.inference.scripted import render_tool_call
from workflows.agent_task import AgentTaskWorkflow

PROMPT_IDS = [1, 2, 3]
COMPLETION_IDS = [4, 5]
OBSERVATION_IDS = [6, 7]


async def connect(address: str, namespace: str) -> Client:
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter
    )


async def start(
    client: Client, task: AgentTaskInput, suffix: str = "", **options: Any
) -> WorkflowHandle[Any, AgentTaskResult]:
    """Start `task`'s AgentTaskWorkflow on its queue, as `<run>-<task id><suffix>`."""
    return await client.start_workflow(
        AgentTaskWorkflow.run,
        task,
        id=f"{task.run_id}-{task.task.id}{suffix}",
        task_queue=Queue.AGENT_TASKS.value,
        **options,
    )


@contextlib.asynccontextmanager
async def running_workers(
    client: Client, by_queue: dict[Queue | str, dict[str, Sequence[Any]]]
) -> AsyncIterator[None]:
    """Run one Worker per queue (kwargs: activities=…, workflows=…) for the `with` block."""
    workers = [
        Worker(client, task_queue=str(queue), max_concurrent_activities=16, **kwargs)
        for queue, kwargs in by_queue.items()
    ]
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


Script = Callable[[int, int], "str | ToolCall"]


class ScriptedModel:
    """A `generate` activity whose answer for (sample, step) is `script(sample, step)`: a
    program for `code` tasks; a `ToolCall` (rendered in the model's format) or raw text for
    `workspace`, returned as its brief as `generate` returns it. `gate(step)`, if given, is
    awaited before answering a step."""

    def __init__(
        self,
        store: ObjectStore,
        script: Script,
        version: int = 0,
        gate: Callable[[int], Awaitable[None]] | None = None,
    ):
        self.store, self.script, self.version, self.gate = store, script, version, gate
        self.calls: list[GenerateRequest] = []

    @activity.defn(name=Activity.GENERATE.value)
    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        if self.gate is not None:
            await self.gate(request.turn)
        self.calls.append(request)
        completions, over_budget = [], {}
        for item in request.items:
            prompt = list(PROMPT_IDS)
            if item.previous is not None:
                previous = self.store.get_model(item.previous.key, CompletionRecord)
                prompt = [
                    *previous.prompt_token_ids,
                    *previous.completion_token_ids,
                    *OBSERVATION_IDS,
                ]
            budget = request.max_context_tokens - request.sampling.max_new_tokens
            if len(prompt) > budget:
                over_budget[item.sample] = len(prompt)
                continue
            completions.append(self._answer(request, item.sample, prompt))
        return GenerateResponse(
            policy_version=self.version, completions=completions, over_budget=over_budget
        )

    def _answer(self, request: GenerateRequest, sample: int, prompt: list[int]) -> Completion:
        answer = self.script(sample, request.turn)

        def key(name: str) -> str:
            return keys.turn_key(request.run_id, request.task_id, sample, request.turn, name)

        if request.env is EnvName.CODE:
            assert isinstance(answer, str)
            text = f"```python\n{answer}\n```"
        else:
            text = render_tool_call(answer) if isinstance(answer, ToolCall) else answer
        record = CompletionRecord(
            text=text,
            prompt_token_ids=prompt,
            completion_token_ids=COMPLETION_IDS,
            logprobs=[-0.5, -0.25],
            policy_version=self.version,
        )
        action: dict[str, Any] = {}
        if request.env is EnvName.CODE:
            action["code"] = self.store.put_text(key("code.py"), str(answer))
        else:
            action["call"] = parse_tool_call(text, WORKSPACE_TOOLS).brief()  # as generate
        return Completion(
            sample=sample,
            completion=self.store.put_json(key("completion.json"), record),
            num_tokens=len(COMPLETION_IDS),
            prompt_tokens=len(prompt),
            **action,
        )


def tree_digest(tree: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


class ScriptedSandbox:
    """One sandbox worker's sessions: `open_sessions` and `verify_episodes` on `sandbox`,
    `env_step` and `close_sessions` on its own queue. A workspace is a dict of files; `bash`
    only echoes; the verifier passes a workspace whose `fixed.py` reads `ok`. A step runs the
    whole call, parsed again from its record where the brief it came with was cut, as
    `env_step` does."""

    def __init__(self, store: ObjectStore, name: str):
        self.store, self.queue = store, f"sandbox-{name}"
        self.sessions: dict[str, dict[str, str]] = {}
        self.steps_run: list[tuple[int, int]] = []  # (sample, step), in the order they ran
        self.closed: list[str] = []
        self.opened = 0

    def workers(self) -> dict[Queue | str, dict[str, Sequence[Any]]]:
        return {
            Queue.SANDBOX: {"activities": [self.open_sessions, self.verify_episodes]},
            self.queue: {"activities": [self.env_step, self.close_sessions]},
        }

    def _snapshot(self, tree: dict[str, str]) -> ObjectRef:
        digest = tree_digest(tree)
        return self.store.put_json(f"scripted-snapshots/{digest}.json", tree)

    def _ref(self, session_id: str) -> SessionRef:
        tree = self.sessions[session_id]
        return SessionRef(
            session_id=session_id,
            queue=self.queue,
            snapshot=self._snapshot(tree),
            tree_digest=tree_digest(tree),
        )

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        sessions = {}
        for sample in req.samples:
            source = req.snapshots.get(sample, req.workspace.files)
            # the real worker's digest of run and task (`session_id`): the longest ids fit
            session_id = (
                f"{real_session_id(req.run_id, req.task_id, sample)}-{self.queue}-{self.opened}"
            )
            self.opened += 1
            self.sessions[session_id] = json.loads(self.store.get_verified(source))
            sessions[sample] = self._ref(session_id)
        return OpenSessionsResponse(sessions=sessions)

    @activity.defn(name=Activity.ENV_STEP.value)
    async def env_step(self, req: EnvStepRequest) -> EnvStepResponse:
        outcomes = []
        for item in req.items:
            tree = self.sessions.get(item.session.session_id)
            if tree is None:
                raise fail(ErrorType.SESSION_LOST, f"{item.session.session_id} is not here")
            call = item.call
            if call.cut:  # as env_step: the whole call, parsed again from the turn's record
                record = self.store.get_model(item.completion.key, CompletionRecord)
                try:
                    call = full_call(call, record.text, WORKSPACE_TOOLS, thinking=record.thinking)
                except ValueError as exc:  # as env_step: a call that can never run
                    where = f"items[sample {item.sample}].completion"
                    raise invalid(where, f"{item.completion.key}: {exc}") from exc
            text, status, submitted = self._run(tree, call)
            self.steps_run.append((item.sample, req.step))
            key = keys.turn_key(req.run_id, req.task_id, item.sample, req.step, "observation.txt")
            outcomes.append(
                EnvStepOutcome(
                    sample=item.sample,
                    call=item.call,
                    observation=self.store.put_text(key, text),
                    status=status,
                    submitted=submitted,
                    session=self._ref(item.session.session_id),
                )
            )
            await asyncio.sleep(0)
        return EnvStepResponse(outcomes=outcomes)

    @staticmethod
    def _run(tree: dict[str, str], call: ToolCall) -> tuple[str, ExecStatus | None, bool]:
        if call.error:
            return f"error: {call.error}", None, False
        args = call.arguments
        match call.name:
            case "write_file":
                tree[args["path"]] = args["content"]
                return f"wrote {args['path']}", None, False
            case "read_file":
                return tree.get(args["path"], "no such file"), None, False
            case "bash":
                return f"$ {args['command']}\n", ExecStatus.PASSED, False
            case _:
                return "submitted", None, True

    @activity.defn(name=Activity.VERIFY_EPISODES.value)
    async def verify_episodes(self, req: VerifyRequest) -> VerifyResponse:
        verdicts = []
        for item in req.items:
            tree = json.loads(self.store.get_verified(item.snapshot))
            passed = tree.get("fixed.py") == "ok"
            result = self.store.put_json(
                f"scripted-verdicts/{tree_digest(tree)}.json", {"passed": passed}
            )
            verdicts.append(
                Verdict(
                    sample=item.sample,
                    status=ExecStatus.PASSED if passed else ExecStatus.FAILED,
                    tests_passed=int(passed),
                    tests_total=1,
                    score=float(passed),
                    result=result,
                )
            )
        return VerifyResponse(verdicts=verdicts)

    @activity.defn(name=Activity.CLOSE_SESSIONS.value)
    async def close_sessions(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        closed = [s for s in req.session_ids if self.sessions.pop(s, None) is not None]
        self.closed += closed
        return CloseSessionsResponse(closed=len(closed))
