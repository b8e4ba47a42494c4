"""What the vLLM engine leaves behind: its ZMQ IPC sockets live in a private directory of the
worker's, gone when the engine closes and, after a worker was killed, at the next start.

vLLM binds its IPC endpoints at `VLLM_RPC_BASE_PATH/<uuid4>` (`get_open_zmq_ipc_path`), the temp
dir unless set: every SIGKILLed worker (tests, chaos drills) left its sockets in /tmp for good.
- the engine starts with `VLLM_RPC_BASE_PATH` set to `tempered-vllm-<pid>-*` (mode 0700) in the
  temp dir (here a test's own), removed with its sockets when the backend closes;
- a new engine's start removes the directories of dead workers (no /proc entry for the pid in
  the name), not a live worker's, nor anything not named as the engine's directories are;
- against the real engine (slow: it starts one; `make test` keeps test_vllm.py's live update):
  closed, it leaves no process, no socket nor other file in the temp dir, no shared memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest

from infra.inference import vllm_engine
from infra.inference.vllm import VLLMBackend
from infra.settings import VLLMSettings

ENGINE_ENV = (
    "VLLM_RPC_BASE_PATH",
    "OMP_NUM_THREADS",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_LOGGING_LEVEL",
    "TOKENIZERS_PARALLELISM",
)


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temp dir, for this test: its own; the engine's environment as it was, after it."""
    base = tmp_path / "temp"
    base.mkdir()
    use_temp(base, monkeypatch)
    yield base
    vllm_engine.remove_ipc_dir()  # what a failed test left: only this process's, in `base`


@pytest.fixture
def short_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`temp` by a short name, a link in the temp dir: a socket's path must fit in 107 bytes
    (sun_path), and pytest's tmp_path, the engine's directory and a uuid do not. Only the link
    is removed there, after."""
    base = tmp_path / "temp"
    base.mkdir()
    link = Path(tempfile.gettempdir()) / f"tvl-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    link.symlink_to(base, target_is_directory=True)
    use_temp(link, monkeypatch)
    try:
        yield link
    finally:
        vllm_engine.remove_ipc_dir()
        assert link.is_symlink() and link.name.startswith("tvl-") and link.resolve() == base
        link.unlink()


def use_temp(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`base` as the temp dir (`tempfile.gettempdir()`, the engine's processes' `TMPDIR`), the
    engine's environment restored after the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    monkeypatch.setenv("TMPDIR", str(base))
    for name in ENGINE_ENV:
        monkeypatch.delenv(name, raising=False)


def dead_pid() -> int:
    """A pid with no process: a child that exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not Path(f"/proc/{child.pid}").exists()
    return child.pid


def test_the_engine_starts_with_its_sockets_in_a_private_directory_removed_on_close(
    temp: Path,
) -> None:
    vllm_engine.configure_processes(VLLMSettings())
    ipc = Path(os.environ["VLLM_RPC_BASE_PATH"])
    assert ipc.parent == temp and ipc.name.startswith(f"tempered-vllm-{os.getpid()}-")
    assert ipc.is_dir() and stat.S_IMODE(ipc.stat().st_mode) == 0o700
    vllm_engine.configure_processes(VLLMSettings())  # a rebuild: the same directory
    assert os.environ["VLLM_RPC_BASE_PATH"] == str(ipc)
    (ipc / "6f1e0c2a-4b1d-4c7e-9a43-0d8a1f6b2c55").touch()  # a socket vLLM did not unlink

    backend = VLLMBackend(VLLMSettings())
    backend._thread = vllm_engine.EngineThread()  # as after start(), with no engine in it
    asyncio.run(backend.close())
    assert list(temp.iterdir()) == [] and "VLLM_RPC_BASE_PATH" not in os.environ


def test_a_new_engine_sweeps_the_directories_of_dead_workers_only(temp: Path) -> None:
    dead, live = dead_pid(), os.getpid()
    gone = temp / f"tempered-vllm-{dead}-k3j2h1gf"
    kept = [temp / f"tempered-vllm-{live}-a1b2c3d4", temp / f"tempered-vllm-x{dead}-a1b2c3d4"]
    kept += [temp / f"other-{dead}-a1b2c3d4", temp / f"tempered-vllm-{dead}"]
    for path in [gone, *kept]:
        path.mkdir()
        (path / "0b5c3c8e-5d0f-4b8e-8f0a-3f9c2d1e7a66").touch()
    assert vllm_engine.sweep_dead_ipc_dirs(temp) == 1
    assert not gone.exists() and all(path.exists() for path in kept)

    gone.mkdir()  # a worker killed since: the next engine's start sweeps it
    vllm_engine.configure_processes(VLLMSettings())
    assert not gone.exists() and all(path.exists() for path in kept)
    vllm_engine.remove_ipc_dir()


def sockets(directory: Path) -> set[Path]:
    return {path for path in directory.iterdir() if path.is_socket()}


def engine_processes(before: set[int]) -> list[psutil.Process]:
    """This process's descendants started since `before` that still run (a zombie has ended;
    multiprocessing's resource tracker lives as long as this process, by design)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.pid in before or child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "multiprocessing.resource_tracker" not in " ".join(child.cmdline()):
                alive.append(child)
    return alive


@pytest.mark.slow  # starts an engine: minutes on a loaded 2-core machine
@pytest.mark.timeout(1800)
@pytest.mark.skipif(find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_real_engine_leaves_no_process_socket_file_or_shared_memory(
    short_temp: Path, smollm2: Path
) -> None:
    """Closed, the engine leaves nothing: no process, no socket, no file in the temp dir (its
    worker's gloo rendezvous file, `vllm_dist_*`; torch's shared compile cache aside), none of
    its shared-memory segments (its message queues). vLLM's shutdown waits up to 5 s for its
    engine core, whose worker's graceful exit removes the file and the segments: killing the
    engine at once (`shutdown(timeout=0)`) was 5 s sooner and left them all, until the
    worker process exited."""
    temp, before = short_temp, {p.pid for p in psutil.Process().children(recursive=True)}
    backend = VLLMBackend(VLLMSettings(kv_cache_gib=0.25, max_num_seqs=4, max_model_len=512))
    backend.start(smollm2)
    try:
        ipc = Path(os.environ["VLLM_RPC_BASE_PATH"])
        assert ipc.parent == temp and sockets(ipc)  # vLLM's endpoints: in the private directory
        assert not sockets(temp) and list(temp.glob("vllm_dist_*"))
        shared = {
            f.path
            for process in engine_processes(before)
            for f in process.open_files()
            if f.path.startswith("/dev/shm/")
        }
        assert shared  # the engine core's and its worker's message queues
    finally:
        asyncio.run(backend.close())
    _, alive = psutil.wait_procs(engine_processes(before), timeout=10)  # a killed one: ending
    assert not alive, alive
    assert not sockets(temp)
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert [path for path in shared if Path(path).exists()] == []
