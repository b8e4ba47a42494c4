"""The `load_tasks` activity (queue `rewards`): a suite's train and held-out tasks, minus quarantine.

Task files are read here, not in the workflow, so the workflow stays deterministic.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from contracts.errors import invalid
from contracts.learner import LoadTasksRequest, LoadTasksResponse
from contracts.names import Activity
from infra.settings import Settings
from infra.tasks import load_quarantine, load_suite


class TaskActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @activity.defn(name=Activity.LOAD_TASKS.value)
    async def load_tasks(self, request: LoadTasksRequest) -> LoadTasksResponse:
        return await asyncio.to_thread(self._load, request)

    def _load(self, request: LoadTasksRequest) -> LoadTasksResponse:
        try:
            tasks = load_suite(request.suite)
        except (ValueError, FileNotFoundError) as err:
            raise invalid("suite", str(err)) from None
        skipped = (
            load_quarantine(self._settings, request.suite) if request.skip_quarantined else set()
        )
        kept = [t for t in tasks if t.id not in skipped]
        return LoadTasksResponse(
            train=[t for t in kept if t.split == "train"],
            heldout=[t for t in kept if t.split == "heldout"],
            quarantined=sorted(skipped & {t.id for t in tasks}),
        )
