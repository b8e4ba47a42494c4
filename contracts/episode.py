"""Contracts of agent episodes: tools, tool calls, workspace sessions, steps and verdicts.

An episode is one sample of a task's GRPO group, acting through an environment's tools:

    INIT      open_sessions    (queue sandbox: a workspace per episode, on one sandbox worker)
    GENERATE  generate         (queue inference: the model's turn, token ids in and out; its
                                tool call parsed by infra/inference/toolcalls.py)
    EXECUTE   env_step         (the session's worker queue: run that tool call)
    FEEDBACK  (in the workflow: step bookkeeping; done on submit / step or context budget)
    DONE      verify_episodes  (queue sandbox: a fresh verifier sandbox per final workspace)
              close_sessions   (the session's worker queue; best effort, a TTL reaps the rest)

Sessions are sticky: a session lives on the sandbox worker that opened it, and its steps go to
that worker's own task queue (`SessionRef.queue`). After every step the workspace is
snapshotted to S3 (content-addressed); when the worker dies, `open_sessions` restores the
session on another worker from `SessionRef.snapshot` and the step is run again there.
Payloads carry references only: no workspace, log or observation text crosses Temporal, and a
tool call crosses it as its brief (`ToolCall.brief`: a few hundred characters a value), never
with the file contents or commands it holds whole.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from contracts.common import Contract, Identifier, ObjectRef
from contracts.sandbox import ExecStatus
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec


class ToolSpec(Contract):
    """One tool as the chat template's `tools` argument expects it (OpenAI function format)."""

    name: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    description: str
    parameters: dict[str, Any] = Field(description="JSON schema of the arguments object.")


BRIEF_CHARS = 256
"""The most characters of a call's name, error or any one argument value that its brief keeps
(`ToolCall.brief`): what travels in Temporal payloads."""


class ToolCall(Contract):
    """The action parsed from one model turn; `error` set when the turn held no valid call.

    In Temporal payloads a call travels as its `brief` (a file written whole at every step of
    every episode would otherwise pass the 2 MiB a payload may hold); where the full call is
    needed (`env_step` runs it, `write_trajectories` stores it) it is parsed again from the
    turn's CompletionRecord (`infra.inference.toolcalls.full_call`)."""

    name: str = ""
    arguments: dict[str, Any] = {}
    error: str | None = Field(
        default=None,
        description="Why the turn is not a valid call (malformed, unknown tool, bad "
        "arguments): it becomes an error observation and counts as a step.",
    )
    cut: bool = Field(
        default=False,
        description="A brief whose name, error or argument values were cut to `BRIEF_CHARS` "
        "(each such value ends with a note of its full length): not the call to run.",
    )

    def brief(self) -> ToolCall:
        """This call with its name, error and each argument value at most `BRIEF_CHARS`
        characters (a value other than a string is cut as its JSON text), `cut` set when any
        was cut; the call itself when none was."""
        name = _cut(self.name)
        error = None if self.error is None else _cut(self.error)
        arguments = {key: _brief_value(value) for key, value in self.arguments.items()}
        if name == self.name and error == self.error and arguments == self.arguments:
            return self
        return ToolCall(name=name, arguments=arguments, error=error, cut=True)


def _brief_value(value: Any) -> Any:
    """An argument value of a brief: itself, or its text cut when that is too long."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return _cut(text) if len(text) > BRIEF_CHARS else value


def _cut(text: str) -> str:
    """`text` at most `BRIEF_CHARS` characters, plus a note of its length where it was cut."""
    if len(text) <= BRIEF_CHARS:
        return text
    return f"{text[:BRIEF_CHARS]}… [cut: {len(text)} characters]"


class EpisodeEnd(StrEnum):
    """Why an episode stopped acting (before DONE verifies it)."""

    SUBMITTED = "submitted"
    """The agent called `submit` (workspace) or its answer passed (code)."""
    STEP_BUDGET = "step_budget"
    """`max_turns` steps were taken (`AgentTaskInput.max_turns`: one model turn per step)."""
    CONTEXT_BUDGET = "context_budget"
    """The next prompt would not fit the context budget; ended and recorded, never cut."""
    ABORTED = "aborted"
    """The task was aborted (circuit breaker or an operator's signal)."""


class SessionRef(Contract):
    """Where one episode's workspace lives, and its last durable state."""

    session_id: Identifier
    queue: str = Field(description="Task queue of the sandbox worker holding the session.")
    snapshot: ObjectRef = Field(description="Last snapshot (a compressed tree) in the store.")
    tree_digest: str = Field(description="sha256 over the workspace's paths, modes, contents.")


class OpenSessionsRequest(Contract):
    """Open (or restore, from `snapshots`) one session per sample, all on one worker."""

    run_id: Identifier
    task_id: Identifier
    env: EnvName
    workspace: WorkspaceSpec = Field(
        description="The task's workspace: sessions start from `files`, mounted at `workdir`; "
        "the hidden tests (`verifier`) are never fetched here."
    )
    samples: list[int]
    snapshots: dict[int, ObjectRef] = Field(
        default={}, description="Sample → snapshot to restore instead of the initial one."
    )
    limits: SandboxLimits = SandboxLimits()
    lost_on: list[str] = Field(
        default=[],
        description="A restore: the own queues (`SessionRef.queue`) of the sandbox workers "
        "that failed these sessions' step (alive, on a broken host). Such a worker "
        "declines the open, retryably, so that another worker of the shared queue restores "
        "them, until `lost_on_wait_s` have passed since the open was scheduled; then it opens "
        "them itself (it may be the only worker).",
    )
    lost_on_wait_s: float = Field(
        default=0.0, ge=0.0, description="How long the workers of `lost_on` decline the open."
    )

    @model_serializer(mode="wrap")
    def _without_lost_on(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A request naming no worker is sent without `lost_on` and `lost_on_wait_s`: as it was
        before they existed, so a sandbox worker of an older build (which forbids unknown
        fields) still opens it; one naming a worker needs a worker of this build."""
        data = handler(self)
        if not self.lost_on and isinstance(data, dict):
            data.pop("lost_on", None)
            data.pop("lost_on_wait_s", None)
        return data


class OpenSessionsResponse(Contract):
    sessions: dict[int, SessionRef] = Field(description="Sample → its session.")


class EnvStepItem(Contract):
    sample: int = Field(ge=0)
    session: SessionRef
    completion: ObjectRef = Field(
        description="The turn's CompletionRecord (its text holds the call)."
    )
    call: ToolCall = Field(
        description="The brief of the call GENERATE parsed from that text "
        "(`infra/inference/toolcalls.py`): run as given unless `cut`, else the full call is "
        "parsed again from `completion`. With `error` set it is not run: the error is the "
        "observation."
    )


class EnvStepRequest(Contract):
    """Run each item's tool call in its session; every item's session is on this worker."""

    run_id: Identifier
    task_id: Identifier
    step: int = Field(ge=0)
    env: EnvName
    limits: SandboxLimits = SandboxLimits()
    items: list[EnvStepItem]


class EnvStepOutcome(Contract):
    sample: int
    call: ToolCall = Field(description="The item's call, as it came (a brief).")
    observation: ObjectRef = Field(description="Observation text, as the model will read it.")
    status: ExecStatus | None = Field(
        default=None, description="Of a command or program the call ran (None: no run)."
    )
    submitted: bool = False
    session: SessionRef = Field(description="The session after the step (new snapshot).")


class EnvStepResponse(Contract):
    outcomes: list[EnvStepOutcome]


class VerifyItem(Contract):
    sample: int = Field(ge=0)
    snapshot: ObjectRef = Field(description="The final workspace of the episode.")


class VerifyRequest(Contract):
    """Score final workspaces in fresh verifier sandboxes holding the hidden tests."""

    run_id: Identifier
    task_id: Identifier
    env: EnvName
    workspace: WorkspaceSpec = Field(
        description="The task's workspace: its hidden tests (`verifier`, never in a "
        "workspace) and where the final tree is mounted for them (`workdir`, `env_vars`)."
    )
    limits: SandboxLimits = SandboxLimits()
    items: list[VerifyItem]


class Verdict(Contract):
    sample: int
    status: ExecStatus
    tests_passed: int = Field(default=0, ge=0)
    tests_total: int = Field(default=0, ge=0)
    score: float = Field(ge=0.0, le=1.0, description="1.0 when every hidden test passed.")
    result: ObjectRef = Field(description="The verifier's full ExecutionResult.")


class VerifyResponse(Contract):
    verdicts: list[Verdict]


class CloseSessionsRequest(Contract):
    session_ids: list[Identifier]


class CloseSessionsResponse(Contract):
    closed: int = Field(ge=0)


def _tool(name: str, description: str, **properties: str) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                key: {"type": "string", "description": d} for key, d in properties.items()
            },
            "required": list(properties),
        },
    )


WORKSPACE_TOOLS: tuple[ToolSpec, ...] = (
    _tool(
        "bash",
        "Run a shell command in the workspace (no network; time, output and process limits). "
        "Returns its exit code, stdout and stderr.",
        command="The command, run by /bin/sh -c in the workspace directory.",
    ),
    _tool(
        "read_file",
        "Read a text file of the workspace (a long one is shown cut).",
        path="Path relative to it.",
    ),
    _tool(
        "write_file",
        "Create or overwrite a text file of the workspace.",
        path="Path relative to the workspace.",
        content="The whole new content of the file.",
    ),
    _tool("submit", "Finish the episode: the workspace as it is now is graded."),
)
"""The tools of the `workspace` environment, as the chat template's `tools` argument takes them."""


OBSERVATION_CHARS = 4000
"""Most characters of one observation shown to the model (head and tail kept:
`infra.inference.untrusted.clip`); a cheap first bound, so that a huge output is never
tokenized whole."""
OBSERVATION_TOKENS = 1024
"""Most tokens (about: the cut note and the seams add a few) of one observation. A quarter of
the default context (4,096): with SmolLM2's workspace prompt (~500) and 256 new tokens a turn,
the default three turns (`max_turns`) still fit after two worst-case results."""
CLIPPED_FROM_BYTES = OBSERVATION_TOKENS // 2
"""An observation of more UTF-8 bytes than this may be clipped: a token holds at least a byte
(half the token budget leaves room for a tokenizer's prefix), a character at least one."""

READ_FILE_LINES = re.compile(
    r"\[(?P<path>[^\n]+): lines (?P<first>\d+)-(?P<last>\d+) of (?P<total>\d+)\]\n"
)
"""The first line of a `read_file` result that the observation's clip may cut, or of a range of
lines (`lines_header`): which lines of the file follow, and how many it has. The clip
(`infra.inference.untrusted.clip`) reads it to name the lines it leaves out."""


def lines_header(path: str, first: int, last: int, total: int) -> str:
    """`READ_FILE_LINES`' line for lines `first`..`last` of the file at `path`, of `total`."""
    return f"[{path}: lines {first}-{last} of {total}]\n"


def read_lines_hint(
    path: str, first: int, last: int, tools: Sequence[ToolSpec] = WORKSPACE_TOOLS
) -> str:
    """How the agent reads lines `first`..`last` of the file at `path` (one home for the notes of
    lines not shown): with `read_file`'s `start_line`/`end_line` where its schema takes them,
    else with `bash` (sed; the path as the agent named it, run in the same workdir)."""
    read = next(tool for tool in tools if tool.name == "read_file")
    if "start_line" in read.parameters.get("properties", {}):
        arguments = {"path": path, "start_line": first, "end_line": last}
        return f"read them with read_file: {json.dumps(arguments, ensure_ascii=False)}"
    named = f"./{path}" if path.startswith("-") else path  # not taken for an option of sed
    return f"read them with bash: sed -n '{first},{last}p' {shlex.quote(named)}"
