"""The DeepSpeed learner engine on the tiny preset (CPU, gloo): steps learn, save/load round-trips,
LoRA adapters train alone and save as PEFT adapter directories."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra import grpo
from infra.learner_engine import LearnerEngine
from tests.learner_groups import on_policy_groups
from tests.trajectories import Step, trajectory

CONFIG = GRPOConfig(learning_rate=3e-3, micro_batch_size=3, max_staleness=8)
pytestmark = pytest.mark.xdist_group(__name__)  # one worker computes `groups`


@pytest.fixture(scope="module")
def groups(tiny_dir: Path) -> list[list[Trajectory]]:
    """Two groups of four one-turn samples with on-policy log-probs of the base model."""
    return on_policy_groups(tiny_dir)


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


def test_saving_needs_nothing_from_the_loaded_directory(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    """The directory a version was loaded from is a cache entry another worker may evict while
    the engine trains; a save after that still writes the tokenizer and template files."""
    entry = tmp_path / "cache" / "v0"
    shutil.copytree(tiny_dir, entry)
    engine = LearnerEngine("cpu")
    engine.load(entry, 0, CONFIG)
    shutil.rmtree(entry)  # evicted
    engine.train_step(groups, CONFIG)
    engine.save(tmp_path / "v1")
    companions = [p for p in tiny_dir.iterdir() if p.suffix != ".safetensors"]
    assert any(p.name.startswith("tokenizer") for p in companions)
    for path in companions:
        if path.name not in (
            "config.json",
            "generation_config.json",
            "model.safetensors.index.json",
        ):
            assert (tmp_path / "v1" / path.name).read_bytes() == path.read_bytes(), path.name


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


def test_zero_stage_change_rebuilds_the_engine_still_without_dropout(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    dropping = shutil.copytree(tiny_dir, tmp_path / "tiny-dropout")  # a config with dropout
    config = json.loads((dropping / "config.json").read_text())
    (dropping / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.3}))
    engine = LearnerEngine("cpu")
    engine.load(dropping, 0, CONFIG)
    first = engine.engine
    before = weights(engine)
    staged = CONFIG.model_copy(update={"zero_stage": 2})
    metrics = engine.train_step(groups, staged)
    assert engine.engine is not first and engine.engine.zero_optimization_stage() == 2
    assert engine.module.model.layers[0].self_attn.attention_dropout == 0.0  # as sampled
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
    assert "model.norm.weight" in changed  # the final norm trains with the top layers


def test_frozen_layers_save_to_the_same_shard_files(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    """Shards that hold only frozen tensors are byte-identical from version to version, so a
    publish stores (and a fetch downloads) only the trained layers' shards."""
    engine = LearnerEngine("cpu")
    top_only = CONFIG.model_copy(update={"train_last_layers": 1})
    engine.load(tiny_dir, 0, top_only)
    engine.save(tmp_path / "v0")
    assert engine.train_step(groups, top_only).grad_norm > 0
    engine.save(tmp_path / "v1")
    shards = sorted(p.name for p in (tmp_path / "v0").glob("*.safetensors"))
    assert len(shards) > 3 and shards == sorted(
        p.name for p in (tmp_path / "v1").glob("*.safetensors")
    )
    index = json.loads((tmp_path / "v1" / "model.safetensors.index.json").read_text())
    changed = {
        name
        for name in shards
        if (tmp_path / "v0" / name).read_bytes() != (tmp_path / "v1" / name).read_bytes()
    }
    trained = ("model.layers.1.", "model.norm")
    frozen_only = {
        name
        for name in shards
        if not any(t.startswith(trained) for t, s in index["weight_map"].items() if s == name)
    }
    assert changed and frozen_only and not changed & frozen_only


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


def test_under_turn_credit_a_trajectory_whose_turns_all_tie_is_skipped(tiny_dir: Path) -> None:
    """Rewards differ, but the episode the context budget ended after one failed turn ties
    with the others on turn 0 and never reached turn 1: it gives no gradient, and says why."""
    turn = CONFIG.model_copy(update={"credit": "turn", "turn_discount": 0.0})
    fixed = [Step([1, 2], [10, 20], reward=-0.1), Step([9], [11, 21], reward=0.9)]
    failed = [Step([1, 2], [12, 22], reward=-0.1), Step([9], [13, 23], reward=-0.2)]
    group = [
        trajectory(fixed, reward=0.9, sample=0),
        trajectory(failed, reward=-0.2, sample=1),
        trajectory(failed[:1], reward=-0.1, sample=2),
    ]
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, turn)
    metrics = engine.train_step([group], turn)
    assert sorted(metrics.trained) == ["r.t.s0", "r.t.s1"]
    assert metrics.skipped == {
        "r.t.s2": "zero advantage: on each of its turns its return is the group's mean"
    }
    # under "episode" credit a reward at its group's mean gives none either, and one that
    # ended before its first step has nothing to train on, whatever its reward
    middle = [trajectory(fixed, reward=r, sample=s) for s, r in enumerate([1.0, 0.5, 0.0])]
    ended = trajectory([], reward=0.5, sample=3)
    metrics = engine.train_step([[*middle, ended]], CONFIG)
    assert metrics.skipped == {
        "r.t.s1": "zero advantage: its reward is its group's mean",
        "r.t.s3": "no completion tokens to train on",
    }
    two = [trajectory(fixed, reward=1.0), trajectory([], reward=0.0, sample=1)]
    metrics = engine.train_step([[*two, trajectory(fixed, reward=0.0, sample=2)]], CONFIG)
    assert metrics.skipped == {"r.t.s1": "no completion tokens to train on"}


def test_lora_trains_adapters_only_and_saves_an_adapter_directory(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    lora = CONFIG.model_copy(update={"lora_rank": 4, "lora_alpha": 8, "learning_rate": 1e-2})
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, lora)
    assert engine.adapter_of == 0
    before = weights(engine)
    losses = [engine.train_step(groups, lora).loss for _ in range(3)]
    assert losses[-1] < losses[0] - 1e-3, losses
    after = weights(engine)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_A." in k or ".lora_B." in k for k in changed), changed

    engine.save(tmp_path / "v3", base_name="run/v0")
    files = {p.name for p in (tmp_path / "v3").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert not files & {"config.json", "model.safetensors", "README.md"}
    config = json.loads((tmp_path / "v3" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 8, 0.0)
    assert sorted(config["target_modules"]) == sorted(lora.lora_target_modules)
    assert config["base_model_name_or_path"] == "run/v0"
    adapter = load_file(str(tmp_path / "v3" / "adapter_model.safetensors"))
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert len(adapter) == 2 * 7 * 2  # A and B of 7 projections in 2 layers

    # the adapter reloads as version 3 over v0: same log-probs, same adapter settings enforced
    reloaded = LearnerEngine("cpu")
    reloaded.load(tiny_dir, 3, lora, adapter_dir=tmp_path / "v3", adapter_of=0)
    batch = grpo.collate(grpo.rows_from_group(groups[0], 3, lora).rows, pad_id=0)
    assert torch.allclose(engine.sequence_logprobs(batch), reloaded.sequence_logprobs(batch))
    with pytest.raises(ValueError, match="fixed for a run"):
        reloaded.train_step(groups, lora.model_copy(update={"lora_rank": 8}))
    with pytest.raises(ValueError, match="lora_rank must stay > 0"):
        LearnerEngine("cpu").load(tiny_dir, 3, CONFIG, adapter_dir=tmp_path / "v3", adapter_of=0)


def test_a_checkpoint_stored_in_bfloat16_is_published_in_bfloat16(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    """The learner trains in float32 but writes a version in the dtype its base was stored in:
    a bf16 model published as float32 would double every version's size."""
    stored = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16).save_pretrained(stored)
    for path in tiny_dir.iterdir():  # the tokenizer and chat template
        if not path.name.startswith(("model", "config", "generation_config")):
            shutil.copy(path, stored / path.name)
    engine = LearnerEngine("cpu")
    engine.load(stored, 0, CONFIG)
    engine.train_step(groups, CONFIG)
    engine.save(tmp_path / "v1")
    tensors = {
        name: tensor
        for shard in (tmp_path / "v1").glob("*.safetensors")
        for name, tensor in load_file(shard).items()
    }
    assert tensors and {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_step_metrics_and_the_kl_term_to_the_reference(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    """On-policy groups from v0: nothing clipped, no KL to the sampler nor to the reference (the
    policy is v0). A step later the same groups are off-policy and the policy has left v0: all
    three are positive, and the two KLs agree (the sampler was the reference). The KL term
    needs its reference first."""
    kl = CONFIG.model_copy(update={"kl_coef": 0.1, "learning_rate": 3e-2})
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, kl)
    with pytest.raises(RuntimeError, match="set_reference"):
        engine.train_step(groups, kl)
    engine.load(tiny_dir, 0, kl)
    engine.set_reference(tiny_dir)
    first = engine.train_step(groups, kl)
    assert first.clip_fraction == 0.0
    assert first.kl_sampler == pytest.approx(0.0, abs=1e-6)
    assert first.kl_ref == pytest.approx(0.0, abs=1e-6)
    second = engine.train_step(groups, kl)
    assert second.clip_fraction > 0 and second.kl_sampler > 1e-4
    assert second.kl_ref == pytest.approx(second.kl_sampler, rel=1e-3)
    assert 0 < second.clip_fraction <= 1 and second.tokens == first.tokens


def test_train_last_layers_zero_trains_everything(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    everything = CONFIG.model_copy(update={"train_last_layers": 0})
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, everything)
    before = weights(engine)
    engine.train_step(groups, everything)
    after = weights(engine)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= changed
    assert any(k.startswith("model.layers.0.") for k in changed)


def test_epochs_repeat_the_update_on_the_same_groups_within_one_version(
    tiny_dir: Path, groups: list[list[Trajectory]]
) -> None:
    """μ = 2 updates in one step are the two steps of μ = 1 on the same groups (the ratio is
    taken to the sampler either way), but publish one version; its metrics are the first
    update's, and its clip fraction counts both (the second update is off-policy: clipped)."""
    once = CONFIG.model_copy(update={"learning_rate": 3e-2})
    twice = once.model_copy(update={"epochs": 2})
    stepwise = LearnerEngine("cpu")
    stepwise.load(tiny_dir, 0, once)
    first, second = stepwise.train_step(groups, once), stepwise.train_step(groups, once)
    assert first.clip_fraction == 0.0 < second.clip_fraction
    clipped = second.clip_fraction * second.tokens  # a share of the tokens: a count of them
    assert clipped == pytest.approx(round(clipped), abs=1e-6)
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, twice)
    both = engine.train_step(groups, twice)
    assert engine.version == 1 and stepwise.version == 2
    expected, got = weights(stepwise), weights(engine)
    assert all(torch.allclose(expected[k], got[k], atol=1e-6) for k in expected)
    assert (both.loss, both.grad_norm, both.tokens) == (first.loss, first.grad_norm, first.tokens)
    assert both.clip_fraction == pytest.approx((first.clip_fraction + second.clip_fraction) / 2)


def test_the_one_process_group_leaves_nothing_in_the_temp_dir(tiny_dir: Path) -> None:
    """Its rendezvous was a file in /tmp that outlived every worker (one a process, never
    removed); the store is in memory now."""
    LearnerEngine("cpu").load(tiny_dir, 0, CONFIG)  # forms the group, unless a test here did
    assert torch.distributed.is_initialized()
    temp = Path(tempfile.gettempdir())
    assert not list(temp.glob(f"tempered-dist-{os.getpid()}-*"))


def test_a_model_with_no_pad_and_a_list_of_end_ids_pads_with_the_first(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """Llama 3's configs have no pad token and several end ids: a list the learner once took
    for an int (a TypeError on every load, retried without end)."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(pad_token_id=None, eos_token_id=[7, 8])
    (model_dir / "config.json").write_text(json.dumps(config))
    engine = LearnerEngine("cpu")
    engine.load(model_dir, 0, CONFIG)
    assert engine.pad_id == 7


def test_a_failed_load_leaves_no_version_behind(
    tiny_dir: Path, groups: list[list[Trajectory]], tmp_path: Path
) -> None:
    """Another run's load that fails midway (its adapter over a full-weight config) must not
    leave this run's version standing over half-switched settings: its next step reloads."""
    engine = LearnerEngine("cpu")
    engine.load(tiny_dir, 0, CONFIG)
    engine.train_step(groups, CONFIG)
    with pytest.raises(ValueError, match="LoRA adapter"):
        engine.load(tiny_dir, 1, CONFIG, adapter_dir=tmp_path, adapter_of=0)
    assert engine.version is None  # the activity reloads (`_engine_at`: version != step)
    with pytest.raises(RuntimeError, match="has not been called"):
        engine.train_step(groups, CONFIG)
