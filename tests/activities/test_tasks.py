"""`load_tasks` against a real SeaweedFS: a suite's splits minus its quarantine, a workspace
suite's trees in the store before any task names them, and bad input (an unknown suite, a
quarantine list that is not one) failing once, without retry, naming what is wrong."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.tasks
from activities.tasks import TaskActivities
from contracts.errors import ErrorType
from contracts.run import LoadTasksRequest, LoadTasksResponse
from contracts.task import TaskSpec
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import harbor, load_suite, load_workspace_suite, quarantine_path
from infra.tasks.workspace_task import WorkspaceTask
from tests.activities.heartbeats import timing_out_after
from tests.paths import REPO_ROOT

HARBOR = REPO_ROOT / "examples" / "harbor"


def write_quarantine(settings: Settings, suite: str, text: str) -> None:
    path = quarantine_path(settings, suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def quarantine(settings: Settings, suite: str, ids: list[str]) -> None:
    write_quarantine(settings, suite, json.dumps({"suite": suite, "quarantined": ids}))


@pytest.mark.asyncio
async def test_the_quarantine_is_skipped_unless_asked_for(
    tmp_path: Path, store: ObjectStore
) -> None:
    settings = Settings(home=tmp_path)
    train, heldout = (load_suite("starter", split=s) for s in ("train", "heldout"))
    quarantine(settings, "starter", [train[3].id, heldout[0].id, "no-such-task"])
    acts = TaskActivities(settings, store)

    loaded = await ActivityEnvironment().run(acts.load_tasks, LoadTasksRequest(suite="starter"))
    assert loaded.train == train[:3] + train[4:] and loaded.heldout == heldout[1:]
    assert loaded.quarantined == sorted([train[3].id, heldout[0].id])  # only the suite's own

    request = LoadTasksRequest(suite="starter", skip_quarantined=False)
    everything = await ActivityEnvironment().run(acts.load_tasks, request)
    assert (everything.train, everything.heldout, everything.quarantined) == (train, heldout, [])


@pytest.mark.asyncio
async def test_a_workspace_suites_trees_are_stored_but_not_the_quarantined_tasks(
    tmp_path: Path, store: ObjectStore
) -> None:
    settings = Settings(home=tmp_path)
    every = load_suite("workspace")
    skipped = every[0]
    quarantine(settings, "workspace", [skipped.id])
    loaded = await ActivityEnvironment().run(
        TaskActivities(settings, store).load_tasks, LoadTasksRequest(suite="workspace")
    )
    tasks = loaded.train + loaded.heldout
    assert len(tasks) == len(every) - 1 and loaded.quarantined == [skipped.id]
    for task in tasks:
        assert task.workspace is not None
        for ref in (task.workspace.files, task.workspace.verifier):
            assert store.head(ref.key) == ref, task.id
    assert skipped.workspace is not None
    assert store.head(skipped.workspace.files.key) is None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("suite", "quarantine_text", "message"),
    [
        ("no-such-suite", None, "suite: unknown suite 'no-such-suite'"),
        ("starter", "{}", r"starter\.json: not a quarantine list"),
    ],
)
async def test_bad_input_fails_without_retry_naming_it(
    tmp_path: Path,
    store: ObjectStore,
    suite: str,
    quarantine_text: str | None,
    message: str,
) -> None:
    settings = Settings(home=tmp_path)
    if quarantine_text is not None:
        write_quarantine(settings, suite, quarantine_text)
    with pytest.raises(ApplicationError, match=message) as failed:
        await ActivityEnvironment().run(
            TaskActivities(settings, store).load_tasks, LoadTasksRequest(suite=suite)
        )
    assert failed.value.type == ErrorType.INVALID_INPUT and failed.value.non_retryable


@pytest.mark.asyncio
async def test_a_slow_load_heartbeats_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the load ran in a thread without heartbeating: a suite slower to read than the
    heartbeat timeout timed out, and every retry did too."""
    tasks = load_suite("starter")

    def slow(suite: str) -> list[TaskSpec]:
        time.sleep(1.5)
        return tasks

    monkeypatch.setattr(activities.tasks, "load_suite", slow)
    env = timing_out_after(0.6)
    beats: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    request = LoadTasksRequest(suite="starter", skip_quarantined=False)
    loaded = await env.run(TaskActivities(Settings(home=tmp_path)).load_tasks, request)
    assert sorted(t.id for t in loaded.train + loaded.heldout) == sorted(t.id for t in tasks)
    assert len(beats) >= 3


@pytest.mark.asyncio
async def test_a_suite_too_large_for_a_workflow_payload_fails_without_retry(
    tmp_path: Path, store: ObjectStore
) -> None:
    """Temporal refuses a payload over 2 MiB, and the SDK retried the refused result for ever:
    a suite over `MAX_SUITE_BYTES` fails at once, saying its size."""
    base = load_suite("starter", split="train")[0]
    suite = tmp_path / "large.jsonl"
    lines = []
    for i in range(100):  # 100 tasks of a 16 KiB prompt: 1.6 MiB
        task = base.model_copy(update={"id": f"large-{i}", "prompt": "x" * (16 << 10)})
        lines.append(task.model_dump_json())
    suite.write_text("\n".join(lines) + "\n")
    acts = TaskActivities(Settings(home=tmp_path), store)
    with pytest.raises(ApplicationError, match=r"its 100 tasks take 1\.6 MiB .* over the 1\.5 MiB"):
        await ActivityEnvironment().run(acts.load_tasks, LoadTasksRequest(suite=str(suite)))
    suite.write_text("\n".join(lines[:80]) + "\n")  # 1.3 MiB: carried
    loaded = await ActivityEnvironment().run(acts.load_tasks, LoadTasksRequest(suite=str(suite)))
    assert len(loaded.train) == 80


class Recording:
    """A store that records each object put, in `events` beside the tasks' loads."""

    def __init__(self, events: list[tuple[str, str]]) -> None:
        self.events = events

    def put_bytes(self, key: str, data: bytes) -> None:
        self.events.append(("put", key))


@pytest.mark.asyncio
async def test_a_harbor_suite_is_uploaded_task_by_task_and_its_unloadable_tasks_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every task's trees were held until the whole suite was loaded, and then once more in one
    dict to upload (a suite of large tasks took the worker's memory). A task that does not load
    is logged, one line naming it (the response has no field for it: a run pinned to an older
    build could not decode one)."""
    suite = Path(shutil.copytree(HARBOR, tmp_path / "suite"))
    (suite / "count-lines" / "instruction.md").unlink()
    every = {task.spec.id: task for task in load_workspace_suite(f"harbor:{suite}")}
    owner = {key: name for name, task in every.items() for key in task.objects}
    events: list[tuple[str, str]] = []
    load_task = harbor.load_task

    def recorded(directory: Path, *args: Any, **kw: Any) -> WorkspaceTask:
        events.append(("load", directory.name))
        return load_task(directory, *args, **kw)

    monkeypatch.setattr(harbor, "load_task", recorded)
    acts = TaskActivities(Settings(home=tmp_path), cast(ObjectStore, Recording(events)))
    loaded = await ActivityEnvironment().run(
        acts.load_tasks, LoadTasksRequest(suite=f"harbor:{suite}")
    )
    assert sorted(t.id for t in loaded.train + loaded.heldout) == sorted(every)
    assert [event for event in events if event[0] == "load"] == [
        ("load", name) for name in ("count-lines", "fix-greeting", "sort-names")
    ]
    put = [(kind, owner[key] if kind == "put" else key) for kind, key in events]
    assert put == [
        ("load", "count-lines"),
        ("load", "fix-greeting"),
        *[("put", "fix-greeting")] * len(every["fix-greeting"].objects),
        ("load", "sort-names"),
        *[("put", "sort-names")] * len(every["sort-names"].objects),
    ]
    reasons = {r.getMessage() for r in caplog.records if "skipped a Harbor task" in r.getMessage()}
    assert len(reasons) == 1, reasons
    (reason,) = reasons
    assert "count-lines" in reason and "instruction.md" in reason and "\n" not in reason
    assert set(LoadTasksResponse.model_fields) == {"train", "heldout", "quarantined"}
