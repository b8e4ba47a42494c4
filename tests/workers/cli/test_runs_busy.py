"""`tempered runs prune` and `tempered runs rm` leave a run alone while something reads it (real
Temporal dev server, real SeaweedFS): besides its training run, a `tempered eval --run R
--policy N` in flight (its agent tasks' workflows, `<run>-eval-v<N>-<suite>-<task>`). Prune
deleted the version under the evaluation, rm the evaluation's prefix mid-episode. And `prune
--keep 0`, which deleted the newest version while `latest.json` still named it, is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client

from contracts.learner import PolicyManifest, PolicyVersion
from contracts.names import Queue, Workflow, eval_run_id
from infra import keys
from infra.policy import latest_policy, policy_manifest
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.temporal import TemporalServer
from workers.cli import run

RUN = "busy"
EVAL = eval_run_id(RUN, 2, "starter")  # `tempered eval --run busy --policy 2 --suite starter`


def published(store: ObjectStore, versions: int) -> None:
    """Manifests of versions 0 .. `versions` - 1 (no weights: pruning needs none), latest the
    newest; an evaluation's object."""
    for version in range(versions):
        policy = PolicyVersion(
            run_id=RUN, version=version, prefix=keys.policy_prefix(RUN, version), step=version
        )
        store.put_json(
            keys.policy_manifest_key(RUN, version), PolicyManifest(policy=policy, files={})
        )
        store.put_json(keys.latest_policy_key(RUN), policy)
    store.put_text(f"runs/{EVAL}/trajectories/t--s0.json", "{}")


def left(store: ObjectStore) -> list[int]:
    return [v for v in range(4) if policy_manifest(store, RUN, v) is not None]


async def visible(client: Client, query: str, count: int) -> None:
    """Wait until the visibility store lists `count` workflows for `query`."""
    for _ in range(100):
        if len([w async for w in client.list_workflows(query)]) == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{query!r} never listed {count}")


@pytest.fixture
def settings(
    seaweed: SeaweedServer,
    store: ObjectStore,
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
) -> Settings:
    return Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )


def test_an_evaluation_in_flight_keeps_prune_and_rm_off_its_run(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    published(store, 4)
    task = f"{EVAL}-starter-add-1"  # no worker polls: it stays running
    other = "busy2-eval-v2-starter-starter-add-1"  # another run's evaluation: no matter

    async def start() -> Client:
        client = await Client.connect(settings.temporal.address, namespace=namespace)
        for workflow_id in (task, other):
            await client.start_workflow(
                Workflow.AGENT_TASK.value, id=workflow_id, task_queue=Queue.AGENT_TASKS.value
            )
        await visible(client, 'ExecutionStatus = "Running"', 2)
        return client

    namespace = settings.temporal.namespace
    client = asyncio.run(start())
    for argv in (["runs", "prune", RUN], ["runs", "rm", RUN], ["runs", "rm", RUN, "--force"]):
        assert run(argv, settings) == 2, argv
        err = capsys.readouterr().err
        assert f"still running: {RUN} (an evaluation of it: workflow {task})" in err, err
    assert left(store) == [0, 1, 2, 3] and store.exists(f"runs/{EVAL}/trajectories/t--s0.json")

    async def finish() -> None:
        await client.get_workflow_handle(task).terminate("done")
        await visible(client, 'ExecutionStatus = "Running"', 1)

    asyncio.run(finish())
    assert run(["runs", "prune", RUN], settings) == 0
    assert "deleted policy versions v1, v2;" in capsys.readouterr().out
    assert left(store) == [0, 3]


def test_prune_keep_0_is_refused_for_the_latest_version(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    published(store, 4)
    assert run(["runs", "prune", RUN, "--keep", "0", "--force"], settings) == 2
    err = capsys.readouterr().err
    assert "--keep 0 would delete the run's latest policy version" in err, err
    assert err.count("\n") == 1
    latest = latest_policy(store, RUN)
    assert latest is not None and latest.version == 3 and left(store) == [0, 1, 2, 3]
