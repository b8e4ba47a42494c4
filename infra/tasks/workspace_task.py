"""A `workspace` task with its trees, before they are in the object store.

    task = workspace_task(task_id, prompt, files, tests, check, solution=..., suite=..., split=...)
    task.spec                       # the TaskSpec: `workspace.files`/`.verifier` name the trees
    task.objects                    # key → bytes to upload (the `load_tasks` activity does)

Trees are content-addressed (`infra/environments/tree.py`), so the refs in `spec.workspace` are
known before anything is uploaded, and uploading the same task twice is a no-op. The reference
solution (Harbor's `solution/`, run as `bash /solution/solve.sh` in the workspace) stays with
the task for `tempered tasks validate`; it is never uploaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from contracts.task import EnvName, TaskSpec, WorkspaceSpec
from infra.environments.tree import Check, File, Packed, pack_files
from infra.environments.workspace import SOLVE


@dataclass(frozen=True)
class WorkspaceTask:
    spec: TaskSpec
    files: Packed
    """The initial workspace."""
    tests: Packed
    """The hidden tests, with how they are checked."""
    solution: Packed | None = None
    """The reference solution's tree (`solve.sh` at its top), if the task has one."""

    @property
    def objects(self) -> dict[str, bytes]:
        """Every object the task's spec names (key → stored bytes)."""
        return {**self.files.objects, **self.tests.objects}


def workspace_task(
    task_id: str,
    prompt: str,
    files: Mapping[str, File | bytes | str],
    tests: Mapping[str, File | bytes | str],
    check: Check,
    *,
    solution: Mapping[str, File | bytes | str] | None = None,
    workdir: str = "/app",
    env_vars: Mapping[str, str] | None = None,
    memory_mb: int | None = None,
    suite: str,
    split: Literal["train", "heldout"] = "train",
) -> WorkspaceTask:
    """A workspace task from its in-memory trees (ValueError, via pydantic, if a field is bad)."""
    initial, hidden = pack_files(files), pack_files(tests, check)
    spec = TaskSpec(
        id=task_id,
        prompt=prompt,
        env=EnvName.WORKSPACE,
        workspace=WorkspaceSpec(
            files=initial.ref,
            verifier=hidden.ref,
            workdir=workdir,
            env_vars=dict(env_vars or {}),
            memory_mb=memory_mb,
        ),
        canonical_solution=_text(solution.get(SOLVE)) if solution else None,
        suite=suite,
        split=split,
    )
    return WorkspaceTask(spec, initial, hidden, pack_files(solution) if solution else None)


def _text(content: File | bytes | str | None) -> str | None:
    if content is None:
        return None
    data = content.data if isinstance(content, File) else content
    return data if isinstance(data, str) else data.decode("utf-8", "replace")
