"""The `load_tasks` activity (queue `rewards`): a suite's train and held-out tasks, minus quarantine.

Task files are read here, not in the workflow, so the workflow stays deterministic. For a
`workspace` suite (`basics`, `workspace`, or `harbor:DIR`) each task's initial workspace and
hidden tests are uploaded to the object store, task by task (`infra.tasks.workspace_specs`, as
`tempered eval` does), so the refs in `TaskSpec.workspace` name stored trees. Harbor task
directories that cannot be loaded are skipped and logged, one line each naming the task and
file (not returned: a new response field would not decode in a run pinned to an older build;
`tempered tasks validate` lists them). An unknown suite, an unreadable suite file, directory or
quarantine list fails the activity without retry, naming it. The load runs in a thread and
heartbeats meanwhile (`heartbeating`): reading and uploading a large Harbor suite can take
longer than the heartbeat timeout.

The suite travels inline: in this activity's result and in the run's continue-as-new input
(`RunResume.tasks`), each one Temporal payload, which Temporal refuses above 2 MiB (the SDK
would retry the refused result for ever). A suite above `MAX_SUITE_BYTES` fails here, without
retry, saying its size (HumanEval's 164 tasks take 0.4 MB). Not covered: carrying a larger
suite by reference.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.heartbeat import heartbeating
from contracts.errors import invalid
from contracts.names import Activity
from contracts.run import LoadTasksRequest, LoadTasksResponse
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import is_workspace_suite, load_quarantine, load_suite, workspace_specs

MAX_SUITE_BYTES = 3 << 19
"""The most a run's loaded suite may take as JSON (1.5 MiB): Temporal's 2 MiB payload limit,
less room for the rest of the run's continue-as-new input."""


class TaskActivities:
    def __init__(self, settings: Settings, store: ObjectStore | None = None) -> None:
        self._settings = settings
        self._store = store

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore.from_settings(self._settings)
        return self._store

    @activity.defn(name=Activity.LOAD_TASKS.value)
    async def load_tasks(self, request: LoadTasksRequest) -> LoadTasksResponse:
        return await heartbeating(asyncio.to_thread(self._load, request))

    def _load(self, request: LoadTasksRequest) -> LoadTasksResponse:
        try:
            skipped = (
                load_quarantine(self._settings, request.suite)
                if request.skip_quarantined
                else set()
            )
            if is_workspace_suite(request.suite):  # the trees of those not skipped, stored
                tasks, _ = workspace_specs(
                    request.suite, self.store.put_bytes, keep=lambda spec: spec.id not in skipped
                )
            else:
                tasks = load_suite(request.suite)
        except (ValueError, FileNotFoundError) as err:
            raise invalid("suite", str(err)) from None
        kept = [t for t in tasks if t.id not in skipped]
        response = LoadTasksResponse(
            train=[t for t in kept if t.split == "train"],
            heldout=[t for t in kept if t.split == "heldout"],
            quarantined=sorted(skipped & {t.id for t in tasks}),
        )
        size = len(response.model_dump_json())
        if size > MAX_SUITE_BYTES:
            raise invalid(
                "suite",
                f"{request.suite}: its {len(kept)} tasks take {size / 2**20:.1f} MiB as a workflow "
                f"payload, over the {MAX_SUITE_BYTES / 2**20:.1f} MiB a run carries (Temporal "
                "refuses a payload over 2 MiB): split it into suites for several runs",
            )
        return response
