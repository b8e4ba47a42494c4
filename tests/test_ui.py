"""The Temporal Web UI shows the work: a finished agent task's page, opened in a real headless
browser (Debian `chromium`, installed by scripts/setup-system.sh), holds the model's code and
the sandbox's error log, decoded through the codec server that `tempered up` started.

The stack is `infra.stack.up` on free ports (Temporal + UI, SeaweedFS, codec); the task runs
through the real AgentTaskWorkflow, sandbox and trajectory writer with a scripted model whose
program raises. The page is the task's history view, as the UI serves it, no clicks: its
Result box starts with the lines the codec puts first (`shown`: the trajectory's reward at a
glance, the model's completion and program, the traceback), and the event rows preview them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.rewards import RewardActivities
from activities.sandbox import SandboxActivities
from contracts.names import Queue
from contracts.task import AgentTaskInput, TaskSpec
from infra import codec, stack
from infra.processes import free_port
from infra.seaweed import pick_free_ports
from infra.settings import S3Settings, Settings, TemporalSettings
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, connect, running_workers
from workflows.agent_task import AgentTaskWorkflow

CHROMIUM = shutil.which("chromium")
CODE_LINE = "# the model wrote this line"
PROGRAM = f'def add(a, b):\n    {CODE_LINE}\n    raise ValueError("tempered-ui " + "probe")\n'
ERROR_LINE = "ValueError: tempered-ui probe"  # the last line of the sandbox's traceback
TASK = TaskSpec(
    id="ui-probe",
    prompt="Write add(a, b) returning a + b.",
    entry_point="add",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n",
)
TRIES = 3
"""The UI renders the raw payload first and the decoded one when the codec answers."""

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed: run scripts/setup-system.sh"
)


@pytest.fixture
def ui_stack(tmp_path: Path) -> Iterator[Settings]:
    s3_port, base_port = pick_free_ports()
    settings = Settings(
        home=tmp_path / "home",
        temporal=TemporalSettings(
            address=f"127.0.0.1:{free_port()}",
            ui_port=free_port(),
            http_port=free_port(),
            codec_port=free_port(),
        ),
        s3=S3Settings(endpoint=f"http://127.0.0.1:{s3_port}", embedded_base_port=base_port),
    )
    try:
        lines = stack.up(settings)
        assert any(line.startswith("codec: started") for line in lines), lines
        yield settings
    finally:
        stack.down(settings)


def page_dom(url: str, profile: Path) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--window-size=1400,2000",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.asyncio
async def test_task_page_shows_the_code_and_the_error_log(
    ui_stack: Settings, tmp_path: Path
) -> None:
    settings = ui_stack
    store = ObjectStore.from_settings(settings)
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    model = ScriptedModel(store, lambda sample, turn: PROGRAM)
    workflow_id = f"ui-{uuid.uuid4().hex[:6]}"
    async with running_workers(
        client,
        {
            Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
            Queue.INFERENCE: {"activities": [model.generate]},
            Queue.SANDBOX: {"activities": [SandboxActivities(settings, store).execute]},
            Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
        },
    ):
        handle = await client.start_workflow(
            AgentTaskWorkflow.run,
            AgentTaskInput(task=TASK, run_id="ui", group_size=1, max_turns=1),
            id=workflow_id,
            task_queue=Queue.AGENT_TASKS.value,
        )
        result = await handle.result()
    assert result.solved == [False]
    run_id = (await handle.describe()).run_id
    stored = sorted(store.list_keys("runs/"))

    ui = f"http://127.0.0.1:{settings.temporal.ui_port}"
    url = f"{ui}/namespaces/{settings.temporal.namespace}/workflows/{workflow_id}/{run_id}/history"
    reward = f"reward {json.dumps(result.rewards[0])}"  # a trajectory's line at a glance
    for attempt in range(TRIES):
        dom = page_dom(url, tmp_path / f"profile-{attempt}")
        if CODE_LINE in dom and ERROR_LINE in dom and reward in dom:
            break
    assert codec.endpoint(settings) in dom, "the UI does not know the codec server"
    assert CODE_LINE in dom, "the model's code is not on the page"
    assert ERROR_LINE in dom, "the sandbox's error log is not on the page"
    assert reward in dom, "the reward is not on the page"
    assert sorted(store.list_keys("runs/")) == stored  # the codec read, never wrote
