"""`tempered worker QUEUE` checks the object store once at start (workers/runtime.py,
`infra.storage_checks.check_access`), against a real SeaweedFS and Temporal dev server.

A worker whose activities use S3 started with the development credentials (`tempered` /
`tempered-secret`, the settings' defaults) where the chart's `s3.existingSecret` lacked its
keys, reported ready, and then every S3 activity failed as access denied, retried without end.
Now it exits at start in one line that names the endpoint, the access key id in use (never the
secret) and the settings to set; a store that no retry reaches within the worker's bound
(`runtime.STORE_WAIT_S`) is told in one line too, and one that comes up within it (a pod started
before its store) is waited for. Right credentials start it as before, and the agent-tasks worker
(workflows only, no S3) starts whatever the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.names import Queue
from infra.processes import free_port
from infra.storage import ObjectStore
from tests.fixtures import dies_with_pytest
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.temporal import TemporalServer
from tests.paths import REPO_ROOT

EXIT_BOUND_S = 90.0
"""From the command's start to its exit at a refused check: the imports on two busy cores and
one listing (no retry: refused credentials are no store still starting)."""
READY_BOUND_S = 120.0
"""For a worker with the right credentials to say it is ready."""
STORE_DOWN_S = 2.0
"""How long the store stays down after the worker's first try, in the test of a late store."""
WRONG_SECRET = "not-the-secret-61"

WORKER = """
import sys
from workers import cli, runtime

runtime.STORE_WAIT_S = float(sys.argv[1])
sys.exit(cli.run(["worker", sys.argv[2]]))
"""
"""`tempered worker QUEUE` with the worker's wait for an unreachable store shortened."""


def worker_env(home: Path, temporal: TemporalServer, namespace: str, **s3: str) -> dict[str, str]:
    """This process's environment without its TEMPERED_* variables, with these settings."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TEMPERED_")}
    env |= {
        "TEMPERED_HOME": str(home),
        "TEMPERED_TEMPORAL__ADDRESS": temporal.address,
        "TEMPERED_TEMPORAL__NAMESPACE": namespace,
        "TEMPERED_TELEMETRY__PROMETHEUS_PORT": "0",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return env | {f"TEMPERED_S3__{name.upper()}": value for name, value in s3.items()}


def start(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        dies_with_pytest(command),
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def tempered_worker(queue: Queue, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return start([str(Path(sys.executable).parent / "tempered"), "worker", queue.value], env, cwd)


def exited(process: subprocess.Popen[str], bound_s: float) -> tuple[int, str]:
    """The process's exit status and output; fails the test (killing it) if it runs on."""
    try:
        output, _ = process.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the worker still ran after {bound_s:.0f} s:\n{output[-3000:]}")
    return process.returncode, output


def ready_then_stopped(process: subprocess.Popen[str], queue: Queue) -> str:
    """Wait for the worker's ready line, then SIGTERM it; its output (it exits 0)."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + READY_BOUND_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break  # it exited
        seen.append(line)
        if f"worker ready: queue={queue.value}" in line:
            process.send_signal(signal.SIGTERM)
            code, rest = exited(process, 60)
            assert code == 0, "".join(seen) + rest
            return "".join(seen) + rest
    process.kill()
    rest, _ = process.communicate()
    pytest.fail(f"the worker was not ready:\n{''.join(seen)}{rest}"[-3000:])


@pytest.mark.parametrize(
    ("credentials", "key_named", "hint"),
    [
        # the chart's existingSecret without the keys: the development defaults are used
        ({}, "'tempered'", "the development default"),
        ({"access_key": "test-key", "secret_key": WRONG_SECRET}, "'test-key'", "wrong secret"),
    ],
    ids=["defaults", "wrong-secret"],
)
def test_refused_credentials_end_the_worker_in_one_line(
    seaweed: SeaweedServer,
    store: ObjectStore,
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
    credentials: dict[str, str],
    key_named: str,
    hint: str,
) -> None:
    env = worker_env(
        tmp_path / "home",
        temporal_server,
        namespace,
        endpoint=seaweed.endpoint,
        bucket=store.bucket,
        **credentials,
    )
    code, output = exited(tempered_worker(Queue.REWARDS, env, tmp_path), EXIT_BOUND_S)
    assert code != 0, output
    assert "worker ready" not in output
    lines = [line for line in output.splitlines() if line.startswith("tempered worker: ")]
    assert len(lines) == 1, output
    line = lines[0]
    assert seaweed.endpoint in line and key_named in line and hint in line, line
    assert "TEMPERED_S3__ACCESS_KEY" in line and "TEMPERED_S3__SECRET_KEY" in line, line
    assert "s3.existingSecret" in line, line
    assert WRONG_SECRET not in output and "tempered-secret" not in output
    assert "Traceback" not in output


def right_env(
    tmp_path: Path,
    temporal_server: TemporalServer,
    namespace: str,
    seaweed: SeaweedServer,
    store: ObjectStore,
) -> dict[str, str]:
    """A worker's environment with the store's own endpoint, bucket and keys."""
    return worker_env(
        tmp_path / "home",
        temporal_server,
        namespace,
        endpoint=seaweed.endpoint,
        bucket=store.bucket,
        access_key=seaweed.settings.access_key,
        secret_key=seaweed.settings.secret_key.get_secret_value(),
    )


def test_right_credentials_start_the_worker(
    seaweed: SeaweedServer,
    store: ObjectStore,
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
) -> None:
    env = right_env(tmp_path, temporal_server, namespace, seaweed, store)
    output = ready_then_stopped(tempered_worker(Queue.REWARDS, env, tmp_path), Queue.REWARDS)
    assert "tempered worker:" not in output


def test_a_store_no_retry_reaches_ends_the_worker_in_one_line(
    temporal_server: TemporalServer, namespace: str, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = worker_env(tmp_path / "home", temporal_server, namespace, endpoint=endpoint)
    began = time.monotonic()
    process = start([sys.executable, "-c", WORKER, "2", Queue.REWARDS.value], env, tmp_path)
    code, output = exited(process, EXIT_BOUND_S)
    assert code != 0, output
    assert "worker ready" not in output
    lines = [line for line in output.splitlines() if line.startswith("tempered worker: ")]
    assert len(lines) == 1, output
    assert f"cannot reach S3 at {endpoint}" in lines[0], lines[0]
    assert "TEMPERED_S3__ENDPOINT" in lines[0], lines[0]
    assert time.monotonic() - began < EXIT_BOUND_S


def test_a_store_that_comes_up_later_is_waited_for(
    seaweed: SeaweedServer,
    store: ObjectStore,
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The store is down when the worker checks it, and up (same endpoint, bucket kept) after the
    worker's first failed try: the worker retries, then says it is ready."""
    env = right_env(tmp_path, temporal_server, namespace, seaweed, store)
    seaweed.stop()
    try:
        process = start([sys.executable, "-c", WORKER, "60", Queue.REWARDS.value], env, tmp_path)
        assert process.stdout is not None
        seen: list[str] = []
        while not seen or seaweed.endpoint not in seen[-1]:  # its first try, refused
            seen.append(process.stdout.readline())
            if not seen[-1]:
                pytest.fail(f"the worker exited before it tried the store:\n{''.join(seen)}")
        assert "tempered worker:" not in seen[-1], f"it gave up at once:\n{''.join(seen)}"
        time.sleep(STORE_DOWN_S)  # a few more tries, further apart
    finally:
        seaweed.start()
    output = "".join(seen) + ready_then_stopped(process, Queue.REWARDS)
    assert "tempered worker:" not in output, output


def test_a_worker_without_s3_activities_starts_whatever_the_store(
    temporal_server: TemporalServer, namespace: str, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = worker_env(tmp_path / "home", temporal_server, namespace, endpoint=endpoint)
    process = start([sys.executable, "-c", WORKER, "600", Queue.AGENT_TASKS.value], env, tmp_path)
    ready_then_stopped(process, Queue.AGENT_TASKS)
