"""The pod launcher (`pod_launcher.py`) run as the kubelet runs it: PID 1 of a fresh pid namespace
(`unshare`, as root), with the env of a real Job manifest and its code ConfigMap's files where
the pod mounts them (the stub API server's `pod_command`); and as a subreaper below another
PID 1, as the stub API server runs it. What a program leaves behind is killed, however it is
built."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from contracts.task import SandboxLimits
from infra.sandbox.judge import split_tests
from infra.sandbox.kubernetes_code import build_code
from infra.sandbox.kubernetes_job import build_job_manifest, parse_pod_log, sandbox_rlimits
from infra.sandbox.verifier import checker_job
from tests.infra.sandbox.recorded_k8s.stub_server import pod_command

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root"
)

CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
CHAIN = """
import subprocess
LINK = 'if [ "$1" -gt 0 ]; then sh -c "$0" "$0" $(($1 - 1)) & exec sleep 30; fi; echo; exec sleep 30'
chain = subprocess.Popen(["/bin/sh", "-c", LINK, LINK, "{depth}"], stdout=subprocess.PIPE)
chain.stdout.read(1)  # the deepest link is up: {depth} sleeping processes, each the next's parent
def add(a, b):
    return a + b
"""
"""A chain of shells (each execs `sleep` once it has started the next): forking a Python
process again and again is quadratic in the kernel's reverse maps, a shell's exec is not."""


HOPPER = """
import os
if os.fork() == 0:  # a process that changes its pid without end: fork, let the parent go
    while True:
        if os.fork():
            os._exit(0)
def add(a, b):
    return a + b
"""


def launch(program: str, as_pid_1: bool) -> dict[str, Any]:
    """The launcher's result record. As PID 1 it is the pod's init; otherwise a shell is, and
    the launcher is its child subreaper."""
    limits, nonce = SandboxLimits(timeout_s=10), "n" * 32
    units = split_tests(CHECK, "add")
    job = checker_job(program, CHECK, "", units, "add", limits, sandbox_rlimits(limits))
    manifest = build_job_manifest("tempered-sbx-t", "ns", "img", job, limits, nonce, "w")
    pod = manifest["spec"]["template"]["spec"]
    env = {item["name"]: item["value"] for item in pod["containers"][0]["env"]}
    code = build_code()
    init = [] if as_pid_1 else ["sh", "-c", '"$@"; exit $?', "init"]
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as volumes:
        launcher = pod_command(pod, {code.name: code.manifest("ns")}, Path(volumes))
        assert launcher is not None
        env.update(HOME=work, TMPDIR=work)
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", *init, *launcher],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
        )
    record = parse_pod_log(done.stdout, nonce)
    assert record is not None, (done.stdout[-2000:], done.stderr[-2000:])
    return record


@pytest.mark.parametrize("as_pid_1", [True, False], ids=["pid-1", "subreaper"])
@pytest.mark.parametrize("program", [CHAIN.format(depth=500), HOPPER], ids=["chain", "hopper"])
def test_what_the_program_leaves_is_killed(program: str, as_pid_1: bool) -> None:
    """Killing only PID 1's children, pass after pass, needed a pass per link of a chain: 500
    links outlived the kill grace, and the run became a platform fault, retried forever."""
    record = launch(program, as_pid_1)
    assert record["fault"] == "", record["fault"]
    assert record["verdict"]["status"] == "passed", record
