"""The test servers end with the test process, even a SIGKILLed one (tests/fixtures)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.paths import REPO_ROOT

SERVE = """
import asyncio, sys
from pathlib import Path
import psutil
from infra.stack import codec_service, seaweed_service, temporal_service
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.stack import start_stack
from tests.fixtures.temporal import start_dev_server, time_skipping_server
async def serve():
    temporal = start_dev_server()
    weed = SeaweedServer(Path(sys.argv[1]) / "weed")
    weed.start()
    stack = start_stack(Path(sys.argv[1]) / "stack")  # `tempered up`: daemons by design
    services = [s(stack.settings).pid() for s in (temporal_service, seaweed_service, codec_service)]
    async with time_skipping_server():  # started by the SDK, from a thread of its own
        [skipping] = [
            p.pid for p in psutil.Process().children()
            if p.exe().endswith("temporal-test-server")
        ]
        print(temporal.process.pid, weed.pid, skipping, *services, flush=True)
        await asyncio.sleep(600)
asyncio.run(serve())
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_servers_started_by_a_killed_pytest_end_with_it(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # its wrapper script, never removed, here
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    servers = [int(pid) for pid in parent.stdout.readline().split()]
    try:
        assert len(servers) == 6 and all(alive(pid) for pid in servers), servers
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in servers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in servers if alive(pid)], "a server outlived its pytest"
    finally:
        parent.kill()
        for pid in servers:
            if alive(pid):
                psutil.Process(pid).kill()
