"""`tempered up / down / status` on free ports: idempotent, persistent, clear when a port is taken
or when the stack that runs was started with other settings.

The tests share one stack (`shared_stack`: a start took 10-20 s each): each uses workflow ids
and buckets of its own and leaves the stack running, and `stack` brings it up (`up`, idempotent)
before each, so that a test that failed with its stack down leaves the next one a running stack."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from infra import stack as infra_stack
from infra import stack_services
from infra.processes import free_port
from infra.storage import ObjectStore
from tests.fixtures.stack import Stack, start_stack, take_down

pytestmark = pytest.mark.xdist_group(__name__)  # one worker starts `shared_stack`


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("stack"))
    try:
        yield stack
    finally:
        take_down(stack)


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    infra_stack.up(shared_stack.settings)  # what `tempered up` runs, without a CLI process
    return shared_stack


def test_up_on_a_running_stack_starts_nothing(stack: Stack) -> None:
    before = infra_stack.status(stack.settings)
    again = stack.tempered("up")
    lines = again.stdout.splitlines()  # temporal, seaweedfs, codec
    assert again.returncode == 0 and len(lines) == 3, again.stdout + again.stderr
    assert all(": already running" in line for line in lines), again.stdout
    assert infra_stack.status(stack.settings) == before  # the same processes


def test_histories_survive_down_and_up(stack: Stack) -> None:
    # No worker runs: the workflow just waits, which is enough to be listed and described.
    started = stack.start_task("survivor", {"task": {"id": "t"}})
    assert started.returncode == 0, started.stderr
    ref = stack.store().put_text("probe/persisted.txt", "still here")

    down = stack.tempered("down")
    assert down.returncode == 0 and "temporal: stopped" in down.stdout, down.stdout
    assert "stopped" in stack.tempered("status").stdout
    up = stack.tempered("up")
    assert up.returncode == 0 and "started" in up.stdout, up.stderr

    described = stack.temporal("workflow", "describe", "--workflow-id", "survivor", "-o", "json")
    assert described.returncode == 0, described.stderr
    assert (
        json.loads(described.stdout)["workflowExecutionInfo"]["execution"]["workflowId"]
        == "survivor"
    )
    assert stack.store().get_text(ref.key) == "still here"
    status = stack.tempered("status").stdout
    assert "running (pid" in status and f"127.0.0.1:{stack.port}" in status


def test_taken_port_is_a_clear_error_and_down_touches_only_ours(stack: Stack) -> None:
    assert stack.tempered("down").returncode == 0
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", stack.port))
    squatter.listen()
    try:
        up = stack.tempered("up")
        assert up.returncode != 0
        assert f"port 127.0.0.1:{stack.port} is taken by another process" in up.stderr
        assert "Traceback" not in up.stderr
        again = stack.tempered("down")  # nothing of ours runs: the squatter is left alone
        assert again.returncode == 0 and "was not running" in again.stdout
        socket.create_connection(("127.0.0.1", stack.port), timeout=2).close()  # still alive
    finally:
        squatter.close()
    assert stack.tempered("up").returncode == 0


def test_a_running_stack_is_checked_against_this_commands_settings(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tempered up` said "already running" of a stack started with other ports (every later
    call then failed to reach it), and left another bucket uncreated ("run `tempered up`")."""
    monkeypatch.setattr(stack_services, "LISTEN_WAIT_S", 0.3)  # no start of another in flight
    infra_stack.up(stack.settings)
    temporal = stack.settings.temporal.model_copy(update={"address": f"127.0.0.1:{free_port()}"})
    with pytest.raises(infra_stack.StackError, match="temporal runs, but not at 127.0.0.1:"):
        infra_stack.up(stack.settings.model_copy(update={"temporal": temporal}))
    s3 = stack.settings.s3.model_copy(update={"bucket": "second"})
    second = stack.settings.model_copy(update={"s3": s3})
    infra_stack.up(second)
    store = ObjectStore.from_settings(second)
    store.put_text("probe", "in the second bucket")
    assert store.get_text("probe") == "in the second bucket"
