"""Contracts of the EXECUTE phase: what the sandbox is asked to run and what it reports."""

from enum import StrEnum

from pydantic import Field

from contracts.common import Contract, ObjectRef
from contracts.task import SandboxLimits


class ExecStatus(StrEnum):
    """Outcome of one sandboxed run. Only INFRA_ERROR is the platform's fault (never a reward)."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY_EXCEEDED = "memory_exceeded"
    INFRA_ERROR = "infra_error"


class ExecutionResult(Contract):
    """Full result of one run, as `tempered sandbox run --json` prints and `result.json` stores."""

    status: ExecStatus
    exit_code: int | None = None
    duration_ms: int = Field(default=0, ge=0)
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    tests_passed: int = Field(default=0, ge=0)
    tests_total: int = Field(default=0, ge=0)
    backend: str = "local"
    limits: SandboxLimits = SandboxLimits()
    enforcement: str = Field(
        default="rlimit", description="How limits were enforced: cgroup|rlimit|kubernetes."
    )
    detail: str = Field(default="", description="Why, for the platform's statuses (infra_error).")


class ExecuteItem(Contract):
    sample: int = Field(ge=0)
    code: ObjectRef


class ExecuteRequest(Contract):
    """Run every item's program followed by `tests` (may be empty for a plain program)."""

    run_id: str
    task_id: str
    turn: int = Field(ge=0)
    tests: str = ""
    helpers: str = Field(
        default="", description="The task's trusted helper code (TaskSpec.helpers)."
    )
    hidden_tests: str = Field(
        default="", description="Test units whose failures are never shown (TaskSpec.hidden_tests)."
    )
    entry_point: str | None = None
    limits: SandboxLimits = SandboxLimits()
    items: list[ExecuteItem]


class ExecuteOutcome(Contract):
    """What the workflow needs of one result; the full result is stored at `result`."""

    sample: int
    status: ExecStatus
    tests_passed: int = 0
    tests_total: int = 0
    duration_ms: int = 0
    result: ObjectRef


class ExecuteResponse(Contract):
    outcomes: list[ExecuteOutcome]
