"""Which process created a sandbox Job, and whether it is gone: the Kubernetes backend's own reap.

    process = ProcessId.here()                  # None where /proc does not say
    labels = {PROCESS_LABEL: process.label()}   # on every Job this process creates
    gone = process_gone(ProcessId.parse(label), process)  # True, False, or None: ask the pod

Every process that runs sandbox Jobs under one worker id (the chart's TEMPERED_WORKER_ID is the
pod's name, and so is the hostname) is an instance of its own: the worker, a restart of its
container, a `tempered sandbox run` exec'd beside it. Its first run deletes the Jobs of that
worker id whose process is known to be gone, and only those (`KubernetesBackend.reap`); a live
sibling's Jobs are its own business. A Job names its process by `PROCESS_LABEL`:
"<container>.<pidns>.<pid>.<ticks>":

- container: when PID 1 of the process's pid namespace started, in centiseconds since the
  epoch (the node's boot time plus PID 1's start): a container's start;
- pidns: the inode of that pid namespace; pid, ticks: the process and its start (clock ticks
  since boot), which no later process of that pid can share.

In this process's own container and pid namespace, the Job's process is gone when no process
runs with that pid and start (`process_gone`). In another (a restarted container: a new pid
namespace, a later start) it is gone when the worker's pod runs no container that started then
(`container_running`, within CONTAINER_START_SLACK_S: the pod's `startedAt` and PID 1's start
differ by the runtime's start-up); a `kubectl debug` container or a sibling container is still
running, so its Jobs stay. A pod that cannot be looked up keeps them all, and so do Jobs whose
process is unknown (no label: made before the label existed; /proc unreadable): their
`activeDeadlineSeconds` and TTL bound them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PROCESS_LABEL = "tempered.dev/process"
CONTAINER_START_SLACK_S = 5.0
"""How far a container's `startedAt` (seconds) may be from its PID 1's start: a restarted
container starts at least the kubelet's 10 s back-off after its predecessor ended."""


def _start_ticks(pid: int | str) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of its stat), or None."""
    with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[19])
    return None


def _boot_time_s() -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("btime "):
                return int(line.split()[1])
    return None


@dataclass(frozen=True)
class ProcessId:
    """A process, as `PROCESS_LABEL` names it."""

    container_cs: int
    pidns: int
    pid: int
    ticks: int

    @property
    def container_started_s(self) -> float:
        """When its container (PID 1 of its pid namespace) started, in seconds since the epoch."""
        return self.container_cs / 100

    def label(self) -> str:
        return f"{self.container_cs}.{self.pidns}.{self.pid}.{self.ticks}"

    @classmethod
    def parse(cls, text: str | None) -> ProcessId | None:
        """The process a label names; None for a missing or malformed one."""
        parts = (text or "").split(".")
        if len(parts) != 4 or not all(part.isdigit() for part in parts):
            return None
        container, pidns, pid, ticks = (int(part) for part in parts)
        return cls(container, pidns, pid, ticks)

    @classmethod
    def here(cls) -> ProcessId | None:
        """This process; None where /proc does not tell (PID 1 hidden, no pid namespace link)."""
        hz = os.sysconf("SC_CLK_TCK")
        init, mine, boot = _start_ticks(1), _start_ticks("self"), _boot_time_s()
        try:
            pidns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            return None
        if init is None or mine is None or boot is None:
            return None
        return cls(boot * 100 + init * 100 // hz, pidns, os.getpid(), mine)


def process_gone(process: ProcessId | None, here: ProcessId | None) -> bool | None:
    """Whether `process` (a Job's) has ended: True or False where it ran in this container and
    pid namespace; None where that cannot be told here (unknown, or another container's)."""
    if process is None or here is None:
        return None
    if (process.container_cs, process.pidns) != (here.container_cs, here.pidns):
        return None
    return _start_ticks(process.pid) != process.ticks


def container_running(pod: Any, started_s: float) -> bool:
    """Whether `pod` (the client's V1Pod) runs a container, of any kind, that started at
    `started_s` (seconds since the epoch, within CONTAINER_START_SLACK_S)."""
    status = pod.status
    lists = ("container_statuses", "init_container_statuses", "ephemeral_container_statuses")
    for container in (c for name in lists for c in (getattr(status, name, None) or [])):
        running = container.state.running if container.state else None
        started: datetime | None = running.started_at if running else None
        if started is not None and abs(started.timestamp() - started_s) <= CONTAINER_START_SLACK_S:
            return True
    return False
