"""Bad input to `tempered eval`, `tasks validate` and `sandbox run` is one line on stderr, and
nothing runs or is written: no tasks waiting in Temporal for a policy version that was never
published, no quarantine list drawn from runs that could not pass. Real SeaweedFS, no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest

from contracts.learner import PolicyManifest, PolicyVersion
from contracts.names import Queue
from infra import keys
from infra.seaweed import pick_free_ports
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore
from infra.tasks import load_suite, quarantine_path
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workers.runtime import build_worker, connect

Capture = pytest.CaptureFixture[str]


def one_line(capsys: Capture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_eval_of_a_version_never_published_is_refused_before_any_task_starts(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path, capsys: Capture
) -> None:
    """The tasks waited for the version without a word (`policy_wait_s` each) and stayed in
    Temporal. Temporal here is a port nothing listens on: the refusal comes before it."""
    policy = PolicyVersion(run_id="r1", version=0, prefix=keys.policy_prefix("r1", 0), step=0)
    store.put_json(keys.policy_manifest_key("r1", 0), PolicyManifest(policy=policy, files={}))
    settings = Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=f"127.0.0.1:{pick_free_ports()[0]}"),
    )
    argv = ["eval", "--run", "r1", "--suite", "starter", "--limit", "1", "--policy"]
    assert run([*argv, "3"], settings) == 2
    assert one_line(capsys) == (
        "tempered eval: run 'r1' has no policy version 3 (published: v0; "
        "`tempered runs show RUN` lists them)\n"
    )
    assert run([*argv[:2], "nope", *argv[3:], "0"], settings) == 2
    assert "unknown run 'nope'" in one_line(capsys)  # not "has no policy version 0"


@pytest.mark.parametrize(
    ("timeout", "message"),
    [("0", "greater than 0"), ("-1", "greater than 0"), ("1e9", "less than or equal to 3600")],
)
def test_tasks_validate_with_an_impossible_timeout_runs_and_quarantines_nothing(
    timeout: str, message: str, tmp_path: Path, capsys: Capture
) -> None:
    """`--timeout 0` timed every run out and wrote the suite into its quarantine list."""
    settings = Settings(home=tmp_path / "home")
    argv = ["tasks", "validate", "starter", "--limit", "2", "--repeats", "1", "--timeout"]
    assert run([*argv, timeout], settings) == 2
    assert f"SandboxLimits: timeout_s: Input should be {message}" in one_line(capsys)
    assert not quarantine_path(settings, "starter").exists()


def test_sandbox_run_limits_out_of_bounds_are_one_line(tmp_path: Path, capsys: Capture) -> None:
    program = tmp_path / "program.py"
    program.write_text("print(1)\n")
    argv = ["sandbox", "run", str(program), "--timeout", "-1", "--memory-mb", "0"]
    assert run(argv, Settings(home=tmp_path / "home")) == 2
    assert one_line(capsys) == (
        "tempered sandbox: SandboxLimits: timeout_s: Input should be greater than 0; "
        "memory_mb: Input should be greater than or equal to 16\n"
    )


def test_eval_of_bad_input_exits_2_as_every_command_does(tmp_path: Path, capsys: Capture) -> None:
    """It exited 1, as for a run that failed. Nothing here reaches Temporal or S3."""
    settings = Settings(home=tmp_path / "home")
    problems = {
        ("--policy", "/nonexistent"): "base_model '/nonexistent': no such directory; use a preset",
        ("--policy", "3"): "--policy VERSION needs --run RUN",
        ("--policy", "tiny", "--suite", "nosuch"): "unknown suite 'nosuch'",
    }
    for args, problem in problems.items():
        assert run(["eval", *args], settings) == 2, args
        assert f"tempered eval: {problem}" in one_line(capsys)
    assert not settings.home.exists()  # no model built


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_eval_with_a_queue_no_worker_polls_says_so_and_starts_nothing(
    seaweed: SeaweedServer,
    store: ObjectStore,
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
    capsys: Capture,
) -> None:
    """With no workers, its tasks waited in Temporal without a word, for ever. The queues are
    read as `tempered status` reads them (DescribeTaskQueue's pollers); the agent-tasks worker
    here is the real, versioned one."""
    settings = Settings(
        home=tmp_path / "home",
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )
    argv = ["eval", "--policy", "tiny", "--suite", "starter", "--limit", "1"]
    assert await asyncio.to_thread(run, argv, settings) == 1
    assert one_line(capsys) == (
        "tempered eval: no worker polls agent-tasks, inference, sandbox, rewards, so its tasks "
        "would wait without end; start the workers (`tempered worker all`) and run it again, or "
        "pass --wait-for-workers where they start on demand (KEDA)\n"
    )
    worker, _ = await build_worker(await connect(settings), Queue.AGENT_TASKS, settings)
    async with worker:
        deadline = time.monotonic() + 60
        while True:  # the server lists a poller once it has polled
            assert await asyncio.to_thread(run, argv, settings) == 1
            err = one_line(capsys)
            if "agent-tasks" not in err or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    assert "no worker polls inference, sandbox, rewards, so" in err
    assert not list(store.list_keys("")) and not settings.home.exists()  # tiny not even built

    # where workers start on demand (KEDA scales them from zero), its tasks start and wait
    waiting = asyncio.create_task(asyncio.to_thread(run, [*argv, "--wait-for-workers"], settings))
    client, deadline = await connect(settings), time.monotonic() + 120
    query = 'WorkflowType="AgentTaskWorkflow"'
    while not (started := [w.id async for w in client.list_workflows(query)]):
        assert time.monotonic() < deadline and not waiting.done(), "no evaluation task started"
        await asyncio.sleep(0.5)
    for workflow_id in started:
        await client.get_workflow_handle(workflow_id).terminate("it started: enough for the test")
    with contextlib.suppress(Exception):  # the terminated task fails the command
        await asyncio.wait_for(waiting, 60)
    assert waiting.done()


def test_sandbox_run_of_a_file_that_cannot_be_read_is_one_line_naming_it(
    tmp_path: Path, capsys: Capture
) -> None:
    """It was `[Errno 2] No such file or directory: '…'`, exit 1."""
    program = tmp_path / "program.py"
    program.write_text("print(1)\n")
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\n")
    settings = Settings(home=tmp_path / "home")
    problems = {
        (str(tmp_path / "missing.py"),): f"{tmp_path / 'missing.py'}: no such file",
        (str(program), "--tests", str(tmp_path)): f"{tmp_path}: a directory, not a Python file",
        (str(program), "--helpers", str(tmp_path / "h.py")): f"{tmp_path / 'h.py'}: no such file",
        (str(tmp_path / "latin1.py"),): f"{tmp_path / 'latin1.py'}: not UTF-8 text (invalid "
        "continuation byte at byte 5)",
    }
    for args, problem in problems.items():
        assert run(["sandbox", "run", *args], settings) == 2
        assert one_line(capsys) == f"tempered sandbox: {problem}\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "Expecting value: line 1 column 1 (char 0)"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"broken": "t1"}', "'broken' is not a list"),
    ],
)
def test_tasks_validate_of_part_of_a_suite_with_a_bad_quarantine_list_runs_nothing(
    text: str, why: str, tmp_path: Path, capsys: Capture
) -> None:
    """Every task ran, then the merge failed with "Expecting value: line 1 column 1 (char 0)",
    naming no file, and the results were lost. A partial validation keeps the list's other
    entries, so it cannot go on without them: it is refused before any run, naming the file."""
    settings = Settings(home=tmp_path / "home")
    path = quarantine_path(settings, "starter")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    argv = ["tasks", "validate", "starter", "--limit", "2", "--repeats", "1", "--backend", "local"]
    assert run(argv, settings) == 2
    assert one_line(capsys) == (
        f"tempered tasks: {path}: not a quarantine list ({why}); fix or remove it, or validate "
        "the whole suite (no --split or --limit) to write a new one\n"
    )
    assert path.read_text() == text


def test_a_bad_quarantine_list_is_replaced_by_validating_the_whole_suite(
    tmp_path: Path, capsys: Capture
) -> None:
    """`train` tells the user to rerun `tasks validate`, which hit the same error; the
    validation of the whole suite now writes a new list over it, its results kept."""
    settings = Settings(home=tmp_path / "home")
    suite = tmp_path / "two.jsonl"
    tasks = load_suite("starter", split="train")[:2]
    suite.write_text("".join(task.model_dump_json() + "\n" for task in tasks))
    path = quarantine_path(settings, str(suite))
    path.parent.mkdir(parents=True)
    path.write_text("{")
    train = ["train", "--preset", "tiny", "--suite", str(suite), "--dry-run"]
    assert run(train, settings) == 2
    assert "rerun `tempered tasks validate`" in one_line(capsys)
    argv = ["tasks", "validate", str(suite), "--repeats", "1", "--backend", "local", "--json"]
    assert run(argv, settings) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [task["verdict"] for task in report["tasks"]] == ["clean", "clean"]
    assert f"{path}: not a quarantine list (" in captured.err
    assert "replaced by this validation of the whole suite" in captured.err
    assert json.loads(path.read_text())["tasks"] == 2
    assert run(train, settings) == 0
