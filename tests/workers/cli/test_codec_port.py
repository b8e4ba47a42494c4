"""`tempered codec --port`: a port out of 1–65535 is refused at parse time (70000 and -5
announced "codec server on http://127.0.0.1:70000" and then failed to bind, exit 1; 0 became
the default port, 8234); the banner comes only once the server listens: a port in use is one
line on stderr, exit 1, no banner; and the server it announces answers. The check is the
server's own bind, the only one: a probe bound and closed before it left a moment in which
another process could take the port, and bound every port twice. Real `tempered codec`
processes, each bind of the port reported by an audit hook; ports outside the kernel's
ephemeral range (infra.processes.free_port), which no outgoing connection takes meanwhile."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.processes import free_port
from workers.cli import build_parser

CODEC_WITH_BINDS = """
import sys
def report(event, args):
    if event == "socket.bind":
        print("bind", args[1], file=sys.stderr, flush=True)
sys.addaudithook(report)
from workers.cli import main
main()
"""
"""`tempered ...` (workers/cli/__main__.py) that reports each socket bind on stderr."""


@pytest.mark.parametrize("port", ["70000", "-5", "0", "65536", "http"])
def test_a_port_out_of_range_is_refused_at_parse_time(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["codec", f"--port={port}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port: " in err and ("1 to 65535" in err or "whole number" in err), err


def _codec(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CODEC_WITH_BINDS, "codec", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TEMPERED_HOME": str(tmp_path)},
    )


def _binds(stderr: str, port: int) -> list[str]:
    return [line for line in stderr.splitlines() if line == f"bind ('127.0.0.1', {port})"]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another socket listens on."""
    for _ in range(20):
        port = free_port()
        try:
            held = socket.create_server(("127.0.0.1", port))
        except OSError:  # taken since free_port looked
            continue
        with held:
            yield port
        return
    pytest.fail("no port to hold")


def test_a_port_in_use_is_one_line_and_no_banner(tmp_path: Path, held_port: int) -> None:
    codec = _codec(tmp_path, held_port)
    out, err = codec.communicate(timeout=60)
    assert codec.returncode == 1, (out, err)
    assert "codec server on" not in out, out
    assert len(_binds(err, held_port)) == 1, err  # the server's own, no probe before it
    (line,) = [line for line in err.splitlines() if not line.startswith("bind ")]
    assert line.startswith(f"tempered codec: cannot listen on 127.0.0.1:{held_port} ("), err
    assert line.endswith("(Address already in use)"), err


def test_the_announced_server_answers_on_its_one_bind(tmp_path: Path) -> None:
    port = free_port()
    codec = _codec(tmp_path, port)
    try:
        assert codec.stdout is not None
        banner = codec.stdout.readline()
        assert banner.startswith(f"codec server on http://127.0.0.1:{port} for "), banner
        deadline = time.monotonic() + 10
        while True:  # the banner names a port it listens on already
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the announced server never listened"
                time.sleep(0.05)
    finally:
        codec.terminate()
        _, err = codec.communicate(timeout=10)
    assert len(_binds(err, port)) == 1, err
