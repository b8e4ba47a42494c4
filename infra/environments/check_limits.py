"""The limits a workspace task's check runs under (`checks.py`), from the run's.

    limits = check_limits(check, spec.limits_of(run_limits, cap_mb))   # a Harbor script check
    limits = check_limits(check, run_limits)                           # a functions check

The check's own timeout (Harbor's `[verifier] timeout_sec`) is its deadline and its least CPU
limit; the task's stated memory (`WorkspaceSpec.limits_of`, Harbor's `[environment] memory_mb`,
within the operator's `sandbox.workspaces.max_task_memory_mb`) is its memory limit, as it is of
the task's agent's commands (activities/environment.py).
"""

from __future__ import annotations

import logging
import math

from contracts.task import SandboxLimits, WorkspaceSpec
from infra.environments.tree import Check


def check_limits(check: Check, limits: SandboxLimits) -> SandboxLimits:
    """The run's limits, but the timeout the check states (Harbor's `[verifier] timeout_sec`,
    600 s where task.toml names none) is its wall deadline, shorter than the run's too (a test
    given 5 s ran for the run's 10: a solution too slow for the task scored 1); one that states
    none (the functions kind) keeps the run's. Its CPU limit is at least its wall time, and
    never less than the run's (a multi-threaded test given 600 s, under a run's 2,400 CPU
    seconds, was cut at 600). The memory is `limits`' (the caller's: the task's where it
    states one)."""
    wall = limits.timeout_s if check.timeout_s is None else check.timeout_s
    cpu_s = max(limits.cpu_s, math.ceil(wall))  # at most MAX_CHECK_S: SandboxLimits' bound
    return limits.model_copy(update={"timeout_s": wall, "cpu_s": cpu_s})


log = logging.getLogger("tempered.environments")
_CAPPED: set[str] = set()  # the tasks `task_limits` warned of, in this process


def task_limits(spec: WorkspaceSpec, run: SandboxLimits, cap_mb: int, task: str) -> SandboxLimits:
    """`spec.limits_of(run, cap_mb)` (the operator's `sandbox.workspaces.max_task_memory_mb`);
    a task asking for more than it gets is warned of once in this process."""
    limits = spec.limits_of(run, cap_mb)
    if (spec.memory_mb or 0) > limits.memory_mb and task not in _CAPPED:
        _CAPPED.add(task)
        log.warning(
            "task %s asks for %s MB of memory: its steps and check run within %d MB "
            "(sandbox.workspaces.max_task_memory_mb: %d MB)",
            task, spec.memory_mb, limits.memory_mb, cap_mb,
        )  # fmt: skip
    return limits
