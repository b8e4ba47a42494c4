"""The learner's DeepSpeed engine: one policy held in memory across GRPO steps.

    engine = LearnerEngine(device="cpu")
    engine.load(policy_dir, version=3)               # weights of policy version 3
    metrics = engine.train_step(groups, config)      # one optimizer step; version -> 4
    engine.save(out_dir)                             # HF directory of version 4

The engine is built once per `load` (deepspeed.initialize with a plain torch AdamW, so no fused
Adam or other extension is JIT-compiled) and reused for every following step. On CPU it runs a
one-process gloo group (DS_ACCELERATOR=cpu); on CUDA the NCCL default. Weights and optimizer are
float32; `save` writes the weights in the dtype the loaded checkpoint had (bf16 for smollm2), so
published versions keep the base model's size. After a crash the learner reloads the last
published version: the AdamW moments restart from zero then (documented trade-off: versions are
plain HF directories that inference loads directly). ZeRO stage 0-3 comes from GRPOConfig; a
change of stage rebuilds the engine from the current weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra import grpo
from infra.processes import free_port


class NonFiniteLoss(ArithmeticError):
    """A step's loss was NaN/inf: the update was not applied, the engine must reload."""


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


def _written_by_save(name: str) -> bool:
    """Files of an HF directory that `save` writes itself (or that are not the model's)."""
    weights = name.endswith((".safetensors", ".bin")) or name.endswith(".index.json")
    return weights or name in ("config.json", "generation_config.json", "manifest.json")


def _stored_dtype(model_dir: Path) -> torch.dtype:
    """The dtype a checkpoint's weights are stored in (config.json), float32 if unnamed."""
    config = json.loads((model_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _prepare_single_process(device: str) -> None:
    """Env of a one-process distributed group; must run before deepspeed is first imported.

    The rendezvous itself goes through a file (see `_build`); these variables only tell
    DeepSpeed that the group is already described, so it skips MPI discovery."""
    if device.startswith("cpu"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def _skip_cpu_comm_kernels() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory/oneCCL all-reduce kernels.

    They speed up all-reduce *between* CPU processes on one host; this is one process, and
    building them costs minutes of g++ on first use. DeepSpeed keeps the probed compatibility
    table in one module-level dict (`deepspeed.ops.__compatible_ops__`) and consults it before
    building, so marking the two ops incompatible makes it fall back to plain gloo.
    """
    import deepspeed.ops  # after _prepare_single_process: deepspeed reads the env at import

    compatible = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False
    compatible["deepspeed_ccl_comm"] = False


def _why_no_gradient(
    trajectory_id: str, groups: Sequence[Sequence[Trajectory]], config: GRPOConfig
) -> str:
    """The reason a used (not stale) trajectory contributed no row to the update."""
    group = next(g for g in groups if any(t.id == trajectory_id for t in g))
    if config.kl_coef == 0 and len({t.reward for t in group}) <= 1:
        return "zero advantage: every sample of its group got the same reward"
    return "no completion tokens to train on"


def _train_only_last_layers(model: torch.nn.Module, layers: int) -> None:
    """Freeze all but the last `layers` decoder layers and the final norm (0: train everything).

    On CPU this is what makes a 135M-parameter step affordable: backward stops at the first
    trainable layer. Embeddings (tied to the LM head in SmolLM2) stay frozen.
    """
    if layers <= 0:
        model.requires_grad_(True)
        return
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        raise ValueError("train_last_layers needs a decoder with `model.layers` (Llama-style)")
    model.requires_grad_(False)
    for layer in list(decoder)[-layers:]:
        layer.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


class LearnerEngine:
    """A DeepSpeed-wrapped causal LM plus the state GRPO needs between steps."""

    def __init__(
        self, device: str = "cpu", threads: int = 0, normalization: grpo.Normalization = "tokens"
    ):
        self.device = device
        self.normalization: grpo.Normalization = normalization
        if threads > 0:
            torch.set_num_threads(threads)
        self.version: int | None = None
        self.engine: Any = None
        self.pad_id = 0
        self.save_dtype = torch.float32
        self._config: GRPOConfig | None = None
        self._reference: Any = None  # frozen PreTrainedModel for the KL term
        self._reference_dir: Path | None = None

    # -- weights -------------------------------------------------------------------------------

    def load(self, base_dir: Path, version: int, config: GRPOConfig | None = None) -> None:
        """Load the HF directory `base_dir` as policy `version` and build a fresh engine."""
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        self.save_dtype = _stored_dtype(Path(base_dir))
        pad = model.config.pad_token_id
        self.pad_id = int(pad if pad is not None else (model.config.eos_token_id or 0))
        self._base_dir = Path(base_dir)
        self._build(model, config or GRPOConfig())
        self.version = version

    def set_reference(self, reference_dir: Path | None) -> None:
        """The frozen model the KL term pulls towards (the run's version 0); loaded on first use."""
        if reference_dir != self._reference_dir:
            self._reference_dir, self._reference = reference_dir, None

    def save(self, out_dir: Path) -> None:
        """Write the current weights (and the loaded tokenizer/config files) as an HF directory."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        copy = self._copy_of_weights(self.save_dtype)  # a plain model: tied weights, config dtype
        copy.generation_config = self.module.generation_config
        copy.save_pretrained(out_dir)
        for path in self._base_dir.iterdir():  # tokenizer, chat template, ...
            if path.is_file() and not _written_by_save(path.name):
                shutil.copy2(path, out_dir / path.name)

    @property
    def module(self) -> Any:
        """The wrapped transformers model (a PreTrainedModel)."""
        if self.engine is None:
            raise RuntimeError("LearnerEngine.load() has not been called")
        return self.engine.module  # type: ignore[no-any-return]

    def _build(self, model: torch.nn.Module, config: GRPOConfig) -> None:
        _prepare_single_process(self.device)
        import deepspeed  # only now: the env above must be set before deepspeed's first import

        if not torch.distributed.is_initialized():
            if self.device.startswith("cpu"):
                _skip_cpu_comm_kernels()
            backend = "gloo" if self.device.startswith("cpu") else "nccl"
            # A one-process group rendezvous through a fresh file, not a TCP port: a port picked
            # as free can be taken before torch binds it, and a failed bind would repeat on
            # every retry of the activity (seen as EADDRINUSE in CI).
            rendezvous = (
                Path(tempfile.gettempdir()) / f"tempered-dist-{os.getpid()}-{uuid.uuid4().hex}"
            )
            deepspeed.init_distributed(
                dist_backend=backend,
                verbose=False,
                init_method=f"file://{rendezvous}",
                rank=0,
                world_size=1,
            )
        model.to(self.device)
        _train_only_last_layers(model, config.train_last_layers)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
        ds_config = {
            "train_micro_batch_size_per_gpu": config.micro_batch_size,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": config.max_grad_norm,
            "zero_optimization": {"stage": config.zero_stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self._config = config

    def _gathered(self) -> Any:
        """Context in which ZeRO-3 partitioned parameters are whole (a no-op below stage 3)."""
        if self._config is None or self._config.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed  # imported by _build already; local so _build's order stays the rule

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)

    def _copy_of_weights(self, dtype: torch.dtype) -> Any:
        """A new CPU model of the same architecture holding the current weights in `dtype`."""
        with self._gathered():
            state = {k: v.detach().to("cpu") for k, v in self.module.state_dict().items()}
        model: Any = AutoModelForCausalLM.from_config(self.module.config, dtype=dtype)
        model.load_state_dict(state)
        return model

    def _apply_config(self, config: GRPOConfig) -> None:
        """Adopt this step's knobs; a new ZeRO stage or clip norm rebuilds the engine."""
        assert self._config is not None
        built = (
            self._config.zero_stage,
            self._config.max_grad_norm,
            self._config.train_last_layers,
        )
        if (config.zero_stage, config.max_grad_norm, config.train_last_layers) != built:
            self._build(self._copy_of_weights(torch.float32), config)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = config.learning_rate
        self._config = config

    # -- training ------------------------------------------------------------------------------

    def train_step(
        self,
        groups: Sequence[Sequence[Trajectory]],
        config: GRPOConfig,
        heartbeat: Callable[[], None] | None = None,
    ) -> StepMetrics:
        """One GRPO optimizer step over `groups` (each one task's G trajectories).

        Trajectories more than `config.max_staleness` versions behind `self.version` are dropped
        or down-weighted. The version advances by one even when nothing was trainable (an empty
        step publishes unchanged weights, so the version sequence has no gaps).
        """
        if self.version is None:
            raise RuntimeError("LearnerEngine.load() has not been called")
        started = time.perf_counter()
        self._apply_config(config)
        rows: list[grpo.Row] = []
        used: list[str] = []
        dropped: list[str] = []
        for group in groups:
            part = grpo.rows_from_group(group, self.version, config)
            rows += part.rows
            used += part.used
            dropped += part.dropped
        if config.kl_coef == 0:  # a zero advantage gives no gradient: skip its compute
            rows = [row for row in rows if row.advantage != 0.0]
        with_rows = {row.trajectory_id for row in rows}
        trained = [i for i in used if i in with_rows]
        skipped = {i: _why_no_gradient(i, groups, config) for i in used if i not in with_rows}
        grpo.normalize(rows, self.normalization)
        totals = {"tokens": 0.0, "clipped": 0.0, "kl_sampler": 0.0, "kl_ref": 0.0}
        loss_sum = 0.0
        engine = self.engine
        engine.train()
        batches = list(grpo.micro_batches(rows, config.micro_batch_size, self.pad_id))
        for index, batch in enumerate(batches):
            engine.set_gradient_accumulation_boundary(index == len(batches) - 1)
            batch = batch.to(self.device)
            logits = engine(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
            ).logits
            logprobs = grpo.token_logprobs(logits, batch.input_ids)
            reference = self._reference_logprobs(batch) if config.kl_coef > 0 else None
            loss, stats = grpo.grpo_loss(
                logprobs,
                batch,
                clip_eps=config.clip_eps,
                ref_logprobs=reference,
                kl_coef=config.kl_coef,
            )
            engine.backward(loss, scale_wrt_gas=False)
            loss_sum += float(loss.detach())
            for key in totals:
                totals[key] += stats.get(key, 0.0)
            if heartbeat is not None:
                heartbeat()
        grad_norm = 0.0
        if not math.isfinite(loss_sum):  # never apply (or publish) a NaN/inf update
            message = f"step on version {self.version} gave loss {loss_sum}; nothing was applied"
            self.version = None  # gradients are poisoned: reload the last published version
            raise NonFiniteLoss(message)
        if batches:
            unclipped = self._grad_norm() if config.zero_stage == 0 else None
            engine.step()
            reported = engine.get_global_grad_norm()  # ZeRO's optimizers record it; stage 0 not
            grad_norm = float(reported if reported is not None else unclipped or 0.0)
        self.version += 1
        tokens = max(totals["tokens"], 1.0)
        duration = time.perf_counter() - started
        return StepMetrics(
            loss=grpo.finite(loss_sum),
            grad_norm=grpo.finite(grad_norm),
            tokens=int(totals["tokens"]),
            rows=len(rows),
            trained=trained,
            skipped=skipped,
            dropped_stale=dropped,
            clip_fraction=totals["clipped"] / tokens,
            kl_sampler=totals["kl_sampler"] / tokens,
            kl_ref=totals["kl_ref"] / tokens,
            duration_s=duration,
        )

    @torch.no_grad()
    def _grad_norm(self) -> float:
        """L2 norm of all gradients before clipping (stage 0: they live in `param.grad`)."""
        norms = [p.grad.norm() for p in self.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    @torch.no_grad()
    def _reference_logprobs(self, batch: grpo.MicroBatch) -> torch.Tensor:
        if self._reference is None:
            if self._reference_dir is None:
                raise RuntimeError("kl_coef > 0 needs set_reference(dir) first")
                ref: Any = AutoModelForCausalLM.from_pretrained(
                    self._reference_dir, dtype=torch.float32
                )
            self._reference = ref.to(self.device).eval()
        logits = self._reference(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).logits
        return grpo.token_logprobs(logits, batch.input_ids)

    @torch.no_grad()
    def sequence_logprobs(self, batch: grpo.MicroBatch) -> torch.Tensor:
        """Current log-probs of a batch's tokens (B, T-1); for tests and diagnostics."""
        module = self.module
        was_training = module.training
        module.eval()
        try:
            logits = module(
                input_ids=batch.input_ids.to(self.device),
                attention_mask=batch.attention_mask.to(self.device),
                use_cache=False,
            ).logits
            return grpo.token_logprobs(logits, batch.input_ids.to(self.device)).cpu()
        finally:
            module.train(was_training)
