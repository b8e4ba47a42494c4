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
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from contracts.learner import PolicyManifest, PolicyVersion
from contracts.names import (
    Queue,
    SearchAttr,
    Workflow,
    eval_run_id,
    learner_workflow_id,
    run_workflow_id,
    task_workflow_id,
)
from infra import keys
from infra.policy import latest_policy, policy_manifest
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workflows.search import KEYS

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
    assert "deleted policy versions v1, v2, the workspace snapshots" in capsys.readouterr().out
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


def test_rm_refuses_an_evaluation_or_a_learner_that_still_runs(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs rm` of an evaluation's own run id deleted the prefix its task workflows
    (`<evaluation>-<task>`) were writing: only `train-<id>` and evaluations *of* the id were
    asked for. Nor was a learner that outlives its terminated run (`train-<run>-learner`). A
    workflow of another run whose id only begins alike is no matter."""
    cli_eval = eval_run_id(RUN, 2, "starter", "1a2b3c4d-9f8e7d")  # `tempered eval`'s
    run_eval = eval_run_id(RUN, 3)  # the training run's evaluation of v3
    other_eval = eval_run_id(RUN, 3, "starter", "0f0f0f0f-aaaaaa")  # begins as run_eval does
    workflows = {  # id → TemperedRunId (`tempered eval` starts its tasks without it)
        f"{cli_eval}-starter-add-1": None,
        f"{run_eval}-starter-add-2": run_eval,
        f"{other_eval}-starter-add-2": other_eval,
        learner_workflow_id(run_workflow_id("lone")): None,
        task_workflow_id("lone2", "starter-add-1"): "lone2",  # begins as `lone-` would not
    }
    for run_id in (cli_eval, run_eval, other_eval, "lone", "lone2"):
        store.put_text(f"runs/{run_id}/run.json", "{}")

    async def start() -> Client:
        client = await Client.connect(settings.temporal.address, namespace=namespace)
        for workflow_id, owner in workflows.items():
            attrs = [SearchAttributePair(KEYS[SearchAttr.RUN_ID], owner)] if owner else []
            await client.start_workflow(
                Workflow.AGENT_TASK.value,
                id=workflow_id,
                task_queue=Queue.AGENT_TASKS.value,
                search_attributes=TypedSearchAttributes(attrs),
            )
        await visible(client, 'ExecutionStatus = "Running"', len(workflows))
        return client

    namespace = settings.temporal.namespace
    client = asyncio.run(start())
    for run_id, why in (
        (cli_eval, f"its task: workflow {cli_eval}-starter-add-1"),
        (run_eval, f"its task: workflow {run_eval}-starter-add-2"),
        ("lone", "its learner: workflow train-lone-learner"),
    ):
        assert run(["runs", "rm", run_id], settings) == 2, run_id
        err = capsys.readouterr().err
        assert f"still running: {run_id} ({why})" in err, err
        assert store.exists(f"runs/{run_id}/run.json")

    async def finish() -> None:
        for workflow_id in workflows:
            await client.get_workflow_handle(workflow_id).terminate(reason="done")
        await visible(client, 'ExecutionStatus = "Running"', 0)

    asyncio.run(finish())
    assert run(["runs", "rm", cli_eval, run_eval, "lone"], settings) == 0
    assert not any(store.exists(f"runs/{r}/run.json") for r in (cli_eval, run_eval, "lone"))
