"""A learner that spans ranks: N DeepSpeed processes under torchrun, driven by the learner worker.

    learner = open_learner(settings.learner, log)   # LearnerEngine (ranks = 1) or RankGroup
    learner.load(v3_dir, 3, config)                 # every call runs on every rank, in lockstep
    metrics = learner.train_step(groups, config, heartbeat=beat)
    learner.save(out_dir)                           # rank 0 writes
    learner.close()

    python -m infra.learner_ranks --socket PATH --settings JSON   # one rank (torchrun runs it)

The worker (`RankGroup`, its `train_step` activity in a thread) starts on first use
`python -m torch.distributed.run --standalone --nproc-per-node N -m infra.learner_ranks`: a
single-host c10d rendezvous on a port the OS picks (no fixed port), one process per GPU on cuda
(NCCL), N gloo processes on CPU. Rank 0 connects back to the worker over a Unix socket in a
private (0700) temporary directory, reports every rank's pid, then serves commands: each one is
broadcast to all ranks over a gloo control group (whose wait is unbounded: a learner idles
between steps), runs on every rank's `LearnerEngine`, and rank 0 sends back the result, a
heartbeat per micro-batch meanwhile. Collectives of the step itself time out after
`learner.collective_timeout_s`.

Failure: an input the step can never train on (ValueError) or a NaN/inf loss comes back as that
exception from every rank alike, and the group lives on. Anything else ends the rank; torchrun
then stops the others and exits, the worker sees it (or the socket's end) and raises
`RankGroupFailed` (retryable), killing what is left of the group; the next call starts a fresh
group, which the activity reloads from the last published version. If the worker dies, rank 0
reads the socket's end and the group exits. Not covered: ranks on several hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra.learner_base import Learner, NonFiniteLoss, StepMetrics, prepare_deepspeed
from infra.settings import LearnerSettings

SOCKET = "rank0.sock"
CONTROL_TIMEOUT = timedelta(days=365)
"""How long ranks wait for the worker's next command (the learner idles between steps)."""
EXPECTED = {"ValueError": ValueError, "NonFiniteLoss": NonFiniteLoss}
"""Exceptions every rank raises alike for the same command: reported, the group lives on."""
LOG_TAIL = 12
TORCHRUN_SETS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
"""Variables torchrun sets for its ranks; a worker that trained in-process before has them too."""


class RankGroupFailed(RuntimeError):
    """The rank group died or did not start (a rank was killed, crashed or hung): retry."""


def open_learner(settings: LearnerSettings, log: Path) -> Learner:
    """The learner `settings` asks for: in this process (ranks = 1) or a group of ranks."""
    if settings.ranks == 1:
        # torch, transformers and DeepSpeed: seconds of import that only a learner pays
        from infra.learner_engine import LearnerEngine

        return LearnerEngine(device=settings.device, threads=settings.threads)
    return RankGroup(settings, log)


class RankGroup:
    """`settings.ranks` ranks under torchrun, started on first use, re-formed after a failure."""

    def __init__(self, settings: LearnerSettings, log: Path):
        self.settings = settings
        self.log = log
        self.version: int | None = None
        self.pids: list[int] = []
        """Each rank's pid, by rank (empty while no group runs)."""
        self._adapter_of: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._dir: Path | None = None

    # -- the Learner protocol ------------------------------------------------------------------

    @property
    def adapter_of(self) -> int | None:
        return self._adapter_of

    def load(
        self,
        model_dir: Path,
        version: int,
        config: GRPOConfig | None = None,
        *,
        adapter_dir: Path | None = None,
        adapter_of: int | None = None,
    ) -> None:
        self.version = None
        kwargs = {"adapter_dir": adapter_dir, "adapter_of": adapter_of}
        self._adapter_of = self._call("load", (model_dir, version, config), kwargs)
        self.version = version

    def set_reference(self, reference_dir: Path | None) -> None:
        self._call("set_reference", (reference_dir,))

    def train_step(
        self,
        groups: Sequence[Sequence[Trajectory]],
        config: GRPOConfig,
        heartbeat: Callable[[], None] | None = None,
    ) -> StepMetrics:
        if self.version is None:
            raise RuntimeError("RankGroup.load() has not been called")
        try:
            metrics: StepMetrics = self._call(
                "train_step", ([list(g) for g in groups], config), heartbeat=heartbeat
            )
        except NonFiniteLoss:
            self.version = None  # every rank dropped its weights: reload
            raise
        self.version += 1
        return metrics

    def save(self, out_dir: Path, base_name: str = "") -> None:
        self._call("save", (out_dir, base_name))

    def close(self) -> None:
        """Ask the ranks to exit, then end whatever is left of the group (idempotent)."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(("close", (), {}))
            self._conn.close()
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10)
            self._kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._process, self._conn, self._dir, self.pids = None, None, None, []
        self.version = None

    # -- the group -----------------------------------------------------------------------------

    def _call(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> Any:
        """Run `name` on every rank; rank 0's result, or the exception every rank raised."""
        if self._conn is None:
            self._start()
        assert self._conn is not None
        try:
            self._conn.send((name, args, kwargs or {}))
            while True:
                message = self._receive(deadline=None)
                if message[0] == "beat":
                    if heartbeat is not None:
                        self._beat(heartbeat)
                elif message[0] == "ok":
                    return message[1]
                else:
                    _, kind, text = message
                    raise EXPECTED[kind](text)
        except (OSError, EOFError) as exc:
            self._fail(f"lost rank 0 during {name}: {exc}")

    def _beat(self, heartbeat: Callable[[], None]) -> None:
        """Rank 0's beat, passed on; a heartbeat that raises (a cancelled step) ends the group
        mid-step (its ranks cannot be interrupted), so the next step starts a fresh one."""
        try:
            heartbeat()
        except BaseException:
            self._kill()
            self.close()
            raise

    def _receive(self, deadline: float | None) -> Any:
        """The next message of rank 0, watching the group (and the deadline) meanwhile."""
        assert self._conn is not None and self._process is not None
        while not self._conn.poll(0.2):
            if self._process.poll() is not None:
                self._fail(f"the rank group exited with status {self._process.returncode}")
            if deadline is not None and time.monotonic() > deadline:
                self._fail(f"the rank group did not start in {self.settings.start_timeout_s:.0f}s")
        return self._conn.recv()

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="tempered-learner-"))  # 0700: ours alone
        path = self._dir / SOCKET
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        server.settimeout(0.2)
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={self.settings.ranks}",
            "-m",
            "infra.learner_ranks",
            f"--socket={path}",
            f"--settings={self.settings.model_dump_json()}",
        ]
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_SETS}
        env["OMP_NUM_THREADS"] = str(self.settings.threads or 1)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self.settings.start_timeout_s
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    client, _ = server.accept()
                    break
                if self._process.poll() is not None:
                    self._fail(f"the rank group exited with status {self._process.returncode}")
                if time.monotonic() > deadline:
                    self._fail(f"rank 0 did not connect in {self.settings.start_timeout_s:.0f}s")
        finally:
            server.close()
        client.setblocking(True)
        self._conn = Connection(client.detach())
        _, pids = self._receive(deadline)
        self.pids = list(pids)

    def _fail(self, why: str) -> NoReturn:
        """End the group and raise RankGroupFailed with `why` and the log's last lines."""
        self._kill()
        tail = _tail(self.log, LOG_TAIL)
        self.close()
        raise RankGroupFailed(f"learner ranks: {why}; {self.log} ends with:\n{tail}")

    def _kill(self) -> None:
        """SIGKILL the group's process group (torchrun and its ranks: only what we started)."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()


def _tail(path: Path, lines: int) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# -- one rank (run by torchrun) ----------------------------------------------------------------


def _serve(socket_path: str, settings: LearnerSettings) -> None:
    """Join the group, then run the worker's commands until it says close (or goes away)."""
    import torch

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = settings.device
    if not device.startswith("cpu"):
        device = f"{device.split(':')[0]}:{local_rank}"
        torch.cuda.set_device(device)
    prepare_deepspeed(device)
    import deepspeed  # after prepare_deepspeed, which sets what its first import reads

    from infra.learner_engine import LearnerEngine

    deepspeed.init_distributed(
        dist_backend="gloo" if device.startswith("cpu") else "nccl",
        timeout=timedelta(seconds=settings.collective_timeout_s),
        verbose=False,
    )
    dist = torch.distributed
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    engine = LearnerEngine(device=device, threads=settings.threads)
    conn: Connection | None = None
    if rank == 0:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(socket_path)
        conn = Connection(client.detach())
    pids: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid(), group=control)
    if conn is not None:
        conn.send(("ready", pids))
    while True:
        message: list[Any] = [None]
        if conn is not None:
            try:
                message = [conn.recv()]
            except (EOFError, OSError):  # the worker is gone: so are we
                message = [("close", (), {})]
        dist.broadcast_object_list(message, src=0, group=control)
        name, args, kwargs = message[0]
        if name == "close":
            break
        reply = _run(engine, name, args, kwargs, None if conn is None else _beat(conn))
        if conn is not None:
            conn.send(reply)
    dist.destroy_process_group()


def _beat(conn: Connection) -> Callable[[], None]:
    """Rank 0's heartbeat: one message to the worker per micro-batch."""
    return lambda: conn.send(("beat",))


def _run(
    engine: Any,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    beat: Callable[[], None] | None,
) -> tuple[Any, ...]:
    """One command on this rank's engine: ("ok", result) or ("error", kind, message)."""
    try:
        if name == "load":
            engine.load(*args, **kwargs)
            return ("ok", engine.adapter_of)
        if name == "train_step":
            return ("ok", engine.train_step(*args, heartbeat=beat))
        if name in ("set_reference", "save"):
            return ("ok", getattr(engine, name)(*args))
        raise RuntimeError(f"unknown learner command {name!r}")
    except tuple(EXPECTED.values()) as exc:
        kind = next(k for k, t in EXPECTED.items() if isinstance(exc, t))
        return ("error", kind, str(exc))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One rank of the learner (started by torchrun).")
    parser.add_argument("--socket", required=True, help="The learner worker's Unix socket.")
    parser.add_argument("--settings", required=True, help="LearnerSettings as JSON.")
    args = parser.parse_args(argv)
    _serve(args.socket, LearnerSettings.model_validate_json(args.settings))


if __name__ == "__main__":
    main()
