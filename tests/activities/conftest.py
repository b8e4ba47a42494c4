"""Fixtures of the activity tests: `acts`, the generate activity on a real SeaweedFS with the tiny
preset published as version 0 of `generation.RUN`, served by a `GatedBackend`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from activities.inference import InferenceActivities
from infra.policy import publish_policy
from infra.settings import InferenceSettings, LocalInferenceSettings, Settings
from infra.storage import ObjectStore
from tests.activities.generation import RUN, GatedBackend


@pytest_asyncio.fixture
async def acts(
    tmp_path: Path, store: ObjectStore, tiny_dir: Path
) -> AsyncIterator[InferenceActivities]:
    settings = Settings(
        home=tmp_path,
        inference=InferenceSettings(local=LocalInferenceSettings(threads=1)),
    )
    await asyncio.to_thread(publish_policy, store, RUN, 0, tiny_dir)
    activities = InferenceActivities(
        settings, store=store, backend=GatedBackend(settings.inference.local)
    )
    yield activities
    await activities.close()
