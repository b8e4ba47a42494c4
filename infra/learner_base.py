"""What every learner shares: the Protocol the activities drive, a step's metrics, and how a
process joins DeepSpeed's distributed group.

    learner: Learner = LearnerEngine("cpu")          # in this process (infra.learner_engine)
    learner: Learner = RankGroup(settings.learner)   # N ranks under torchrun (infra.learner_ranks)

`prepare_deepspeed(device)` must run before `deepspeed` is first imported, in the worker and in
every rank; `init_single_process` forms the one-process group of a learner that trains in the
worker itself.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra.credit import flat, turn_advantages
from infra.processes import free_port


class NonFiniteLoss(ArithmeticError):
    """A step's loss was NaN/inf: the update was not applied, the engine must reload."""


class ConfigRefused(ValueError):
    """The step's GRPOConfig asks for what this model or group cannot do (`share_prompt` on a
    sliding-window model): the run's setting at fault, not its trajectories; never retried."""


class StepStopped(Exception):
    """The step was asked to stop (its activity cancelled): raised where it can stop, in the
    step's thread at a micro-batch or check, or by a rank group it ended (`Learner.stopping`)."""


@dataclass
class StepMetrics:
    loss: float
    grad_norm: float
    tokens: int
    rows: int
    trained: list[str]  # trajectory ids whose tokens were in the applied update
    skipped: dict[str, str]  # trajectory id -> why it gave no gradient (e.g. zero advantage)
    dropped_stale: list[str]
    clip_fraction: float
    kl_sampler: float  # mean k3 KL of the trained policy (before the update) to the sampler
    kl_ref: float
    duration_s: float

    def summary(self) -> dict[str, float]:
        """Scalar metrics only (for the ack record and logs)."""
        return {k: v for k, v in asdict(self).items() if isinstance(v, int | float)}


def why_no_gradient(
    trajectory_id: str, groups: Sequence[Sequence[Trajectory]], config: GRPOConfig
) -> str:
    """The reason a used (not stale) trajectory contributed no row to the update."""
    group = next(g for g in groups if any(t.id == trajectory_id for t in g))
    trajectory = next(t for t in group if t.id == trajectory_id)
    if config.kl_coef == 0:  # with a KL term every row with sampled tokens trains
        if config.credit == "episode":
            if flat([t.reward for t in group]):
                return "zero advantage: every sample of its group got the same reward"
            if any(trajectory.loss_mask):
                return "zero advantage: its reward is its group's mean"
        else:  # equal rewards need not mean equal returns, nor unequal ones a turn's signal
            if not any(any(a) for a in turn_advantages(group, config.turn_discount)):
                return "zero advantage: its group's returns are equal on every turn"
            if any(trajectory.loss_mask):
                return "zero advantage: on each of its turns its return is the group's mean"
    return "no completion tokens to train on"


class Learner(Protocol):
    """What the learner activities drive: an engine in this process, or a group of ranks."""

    version: int | None
    """The policy version the weights in memory are; None = reload before the next step."""

    @property
    def adapter_of(self) -> int | None:
        """The full-weight version the trained LoRA adapters apply to; None for full weights."""
        ...

    def load(
        self,
        model_dir: Path,
        version: int,
        config: GRPOConfig | None = None,
        *,
        adapter_dir: Path | None = None,
        adapter_of: int | None = None,
    ) -> None: ...

    def set_reference(self, reference_dir: Path | None) -> None: ...

    def train_step(
        self,
        groups: Sequence[Sequence[Trajectory]],
        config: GRPOConfig,
        heartbeat: Callable[[], None] | None = None,
    ) -> StepMetrics: ...

    def save(self, out_dir: Path, base_name: str = "") -> None: ...

    def stopping(self, stop: threading.Event) -> AbstractContextManager[None]:
        """Within it, `stop` set ends the call in flight with `StepStopped` wherever the learner
        can end it (a rank group's wait on its ranks); an engine in this process stops only at
        the step's own checks (its heartbeat per micro-batch)."""
        ...

    def close(self) -> None: ...


def prepare_deepspeed(device: str) -> None:
    """Set what DeepSpeed reads at its first import, and keep it from building CPU kernels.

    Must run before `deepspeed` is first imported. On CPU, DeepSpeed would JIT-compile its
    shared-memory/oneCCL all-reduce kernels (minutes of g++ on first use); it keeps the probed
    compatibility table in one module-level dict (`deepspeed.ops.__compatible_ops__`) and
    consults it before building, so marking the two ops incompatible makes it use plain gloo.
    """
    if device.startswith("cpu"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops  # after the env above: deepspeed reads it at import

    if device.startswith("cpu"):
        compatible = deepspeed.ops.__compatible_ops__
        compatible["deepspeed_shm_comm"] = False
        compatible["deepspeed_ccl_comm"] = False


def init_single_process(device: str) -> None:
    """A one-process distributed group (the learner trains in the worker process).

    The group meets through an in-memory store, neither a TCP port (a port picked as free can be
    taken before torch binds it; seen as EADDRINUSE in CI) nor a file (its rendezvous file
    outlived the worker in /tmp). DeepSpeed adopts a group torch formed; the variables only tell
    it the group is described already.
    """
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    prepare_deepspeed(device)
    import deepspeed  # only now: prepare_deepspeed must precede its first import
    import torch.distributed as dist

    backend = "gloo" if device.startswith("cpu") else "nccl"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
