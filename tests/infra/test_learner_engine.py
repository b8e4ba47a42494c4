"""The DeepSpeed learner engine on the tiny preset (CPU, gloo): steps learn, save/load round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contracts.learner import GRPOConfig
from contracts.sandbox import ExecStatus
from contracts.trajectory import Trajectory, TrajectoryTurn
from infra import grpo
from infra.learner_engine import LearnerEngine
from infra.policy import TINY, materialize_base_model
from infra.settings import Settings

CONFIG = GRPOConfig(learning_rate=3e-3, micro_batch_size=3, max_staleness=8)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize_base_model(TINY, Settings(home=tmp_path_factory.mktemp("home")))


@pytest.fixture(scope="module")
def groups(tiny_dir: Path) -> list[list[Trajectory]]:
    """Two groups of four one-turn samples with on-policy log-probs of the base model."""
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    generator = torch.Generator().manual_seed(1)
    out = []
    for task in range(2):
        group = []
        for sample in range(4):
            prompt = torch.randint(3, 259, (12,), generator=generator).tolist()
            completion = torch.randint(3, 259, (8 + 4 * sample,), generator=generator).tolist()
            row = grpo.Row("x", prompt + completion, len(prompt), [0.0] * len(completion), 0.0)
            logprobs = engine.sequence_logprobs(grpo.collate([row], pad_id=0))
            old = logprobs[0, len(prompt) - 1 :].tolist()
            turn = TrajectoryTurn(
                turn=0,
                policy_version=0,
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                completion_logprobs=old,
                completion_text="",
                code="",
                status=ExecStatus.FAILED,
                reward=float(sample % 2),
            )
            group.append(
                Trajectory(
                    id=f"r.t{task}.s{sample}",
                    run_id="r",
                    task_id=f"t{task}",
                    sample=sample,
                    group_size=4,
                    prompt="p",
                    turns=[turn],
                    reward=float(sample % 2),
                    solved=sample % 2 == 1,
                    policy_version=0,
                    created_at="",
                )
            )
        out.append(group)
    return out


def weights(engine: LearnerEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def test_steps_change_weights_and_lower_the_loss(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    before = weights(engine)
    losses = []
    for step in range(4):
        metrics = engine.train_step(groups, CONFIG)
        losses.append(metrics.loss)
        assert engine.version == step + 1
        assert metrics.tokens == 2 * (8 + 12 + 16 + 20) and metrics.rows == 8
        assert metrics.grad_norm > 0 and len(metrics.trained) == 8
    # on-policy first step: ratio 1, so the loss is -mean(A) over tokens (not 0: lengths differ)
    assert losses[-1] < losses[0] - 1e-3, losses
    after = weights(engine)
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # save → load round trip: same weights, same log-probs, tokenizer files carried over
    engine.save(tmp_path / "v4")
    assert (tmp_path / "v4" / "tokenizer.json").is_file()
    reloaded = LearnerEngine("cpu")
    reloaded.load(tmp_path / "v4", 4, CONFIG)
    assert reloaded.version == 4
    restored = weights(reloaded)
    assert all(torch.equal(after[k], restored[k]) for k in after)


def test_untrained_save_reproduces_the_base_bytes(tiny_dir: Path, tmp_path: Path) -> None:
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    engine.save(tmp_path / "out")
    for path in tiny_dir.iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name


def test_stale_groups_are_dropped_without_an_update(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    engine = LearnerEngine("cpu")
    strict = CONFIG.model_copy(update={"max_staleness": 1})
    engine.load(tiny_dir, 3, strict)  # trajectories of version 0 are 3 behind, max 1
    before = weights(engine)
    metrics = engine.train_step(groups, strict)
    assert metrics.rows == 0 and len(metrics.dropped_stale) == 8 and metrics.trained == []
    assert engine.version == 4
    assert all(torch.equal(before[k], v) for k, v in weights(engine).items())
    # downweighting keeps them (4 behind, max 1: weight 0.5 ** 3) and does update
    config = strict.model_copy(update={"stale_policy": "downweight"})
    metrics = engine.train_step(groups, config)
    assert metrics.rows == 8 and metrics.dropped_stale == [] and metrics.grad_norm > 0


def test_zero_stage_change_rebuilds_the_engine(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    first = engine.engine
    before = weights(engine)
    staged = CONFIG.model_copy(update={"zero_stage": 2})
    metrics = engine.train_step(groups, staged)
    assert engine.engine is not first and engine.engine.zero_optimization_stage() == 2
    assert metrics.grad_norm > 0
    assert any(not torch.equal(before[k], v) for k, v in weights(engine).items())


def test_train_last_layers_leaves_lower_layers_and_embeddings_untouched(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    engine = LearnerEngine("cpu")
    top_only = CONFIG.model_copy(update={"train_last_layers": 1})
    engine.load(tiny_dir, 0, top_only)
    before = weights(engine)
    metrics = engine.train_step(groups, top_only)
    after = weights(engine)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert metrics.grad_norm > 0 and changed
    assert all(k.startswith(("model.layers.1.", "model.norm")) for k in changed), changed


def test_groups_without_signal_cost_no_compute(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    """A group whose rewards are all equal has zero advantages: no rows are trained on."""
    flat = [[t.model_copy(update={"reward": 0.5}) for t in group] for group in groups]
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    metrics = engine.train_step(flat, CONFIG)
    assert metrics.rows == 0 and metrics.trained == [] and engine.version == 1
    assert len(metrics.skipped) == 8
    assert set(metrics.skipped.values()) == {
        "zero advantage: every sample of its group got the same reward"
    }
