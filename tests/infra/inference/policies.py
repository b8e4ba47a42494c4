"""Policy versions for the inference tests: changed full weights, LoRA adapters, publishing them,
the learner's recomputation of sampled tokens' log-probs (what the importance ratio uses), and
which versions a local backend holds loaded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from contracts.learner import PolicyManifest, PolicyVersion
from infra import grpo, keys
from infra.inference.local import LocalBackend
from infra.policy import WEIGHTS_INDEX, advance_latest, save_weights
from infra.storage import ObjectStore

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def changed_weights(base: Path, out: Path, layers: range, scale: float = 1.6) -> Path:
    """A copy of `base` whose MLP down-projections in `layers` are scaled, plus seeded noise:
    a published version with known changed weights."""
    if (out / WEIGHTS_INDEX).is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("*.safetensors", WEIGHTS_INDEX))
    model = load_model(base)
    state = model.state_dict()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in layers:
            weight = state[f"model.layers.{layer}.mlp.down_proj.weight"]
            noise = torch.randn(weight.shape, generator=generator) * weight.std() * 0.1
            weight.copy_(weight * scale + noise)
    save_weights(model, tmp)
    tmp.rename(out)
    return out


def lora_adapter(base: Path, out: Path, rank: int = 8, seed: int = 1, scale: float = 0.05) -> Path:
    """A random rank-`rank` peft adapter over every projection of `base`, saved with the base's
    tokenizer (what the learner publishes for a LoRA version)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    if (out / "adapter_config.json").is_file():
        return out
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS, init_lora_weights=False
    )
    model = get_peft_model(load_model(base), config)
    with torch.no_grad():  # B starts at zero in training; make the adapter matter
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, scale)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out))
    return out


def publish_adapter(
    store: ObjectStore, run_id: str, version: int, adapter_dir: Path, adapter_of: int
) -> PolicyVersion:
    """Publish a LoRA version: its files, then a manifest naming `adapter_of`, then latest."""
    prefix = f"{keys.policy_prefix(run_id, version)}adapter/"
    files = sorted(p for p in adapter_dir.iterdir() if p.is_file())
    refs = {p.name: store.upload_file(p, prefix + p.name, create_only=True) for p in files}
    policy = PolicyVersion(run_id=run_id, version=version, prefix=prefix, adapter_of=adapter_of)
    manifest = PolicyManifest(policy=policy, files=refs)
    store.put_json(keys.policy_manifest_key(run_id, version), manifest, create_only=True)
    advance_latest(store, policy)
    return policy


@torch.inference_mode()
def learner_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> list[float]:
    """The learner's log-prob of each completion token: one forward over prompt + completion,
    `grpo.token_logprobs` at `temperature`, as `train_step` recomputes them."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    at = torch.tensor([temperature])
    return grpo.token_logprobs(logits, ids, at)[0, len(prompt) - 1 :].tolist()


def loaded_versions(backend: LocalBackend) -> list[tuple[str, int]]:
    """(run, version) of the full-weight policies `backend` holds loaded, least recently used
    first."""
    return list(backend._loaded)
