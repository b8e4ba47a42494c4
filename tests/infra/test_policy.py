"""Policy presets and versioned publishing, against a real SeaweedFS (fixture `store`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from infra import keys
from infra.base_models import SMOLLM2, TINY, _build_once, check_base_model, materialize_base_model
from infra.policy import (
    MANIFEST,
    WEIGHTS_INDEX,
    PolicyIntegrityError,
    advance_latest,
    latest_policy,
    policy_manifest,
    publish_policy,
    save_weights,
)
from infra.policy_cache import BLOBS, fetch_policy
from infra.settings import Settings
from infra.storage import ObjectNotFound, ObjectStore


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): _digest(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def test_tiny_preset_is_deterministic_and_chat_ready(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = materialize_base_model(TINY, Settings(home=tmp_path))
    assert _files(again) == _files(tiny_dir)
    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_dir)
    text = "def f(x):\n    return 'é'"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    decoded = tokenizer.decode(ids)
    assert decoded == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_id == 2 and ids[0] == 1
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.vocab_size == len(tokenizer) == 259


def test_materialize_local_dir_and_rejects_unknown(tiny_dir: Path, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert materialize_base_model(str(tiny_dir), settings) == tiny_dir.resolve()
    with pytest.raises(ValueError, match="no-such-model"):
        materialize_base_model("no-such-model", settings)
    (tmp_path / "empty").mkdir()
    for spec, why in (("/nonexistent", "no such directory"), (str(tmp_path / "empty"), "without")):
        with pytest.raises(ValueError, match=why):  # check_base_model's rule: train's dry run
            check_base_model(spec)
        with pytest.raises(ValueError, match=why):
            materialize_base_model(spec, settings)
    for spec in (TINY, SMOLLM2, str(tiny_dir), "s3://bucket/prefix"):
        check_base_model(spec)  # builds, converts, downloads nothing
    assert not (tmp_path / "models").exists()


def test_concurrent_materializations_build_once(tmp_path: Path) -> None:
    builds: list[Path] = []

    def build(out: Path) -> None:
        builds.append(out)
        time.sleep(0.2)  # long enough that every caller arrives while it runs
        (out / "config.json").write_text("{}")

    target = tmp_path / "models" / "m"
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: _build_once(target, build), range(4)))
    assert done == [target] * 4 and len(builds) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [".m.lock", "m"]  # no tmp left


def test_publish_fetch_round_trip(store: ObjectStore, tiny_dir: Path, tmp_path: Path) -> None:
    assert latest_policy(store, "r1") is None
    v0 = publish_policy(store, "r1", 0, tiny_dir)
    assert v0.version == 0 and v0.prefix.startswith(keys.policy_prefix("r1", 0))
    assert latest_policy(store, "r1") == v0
    fetched = fetch_policy(store, "r1", 0, tmp_path / "cache")
    assert fetched == tmp_path / "cache" / "r1" / "v0"
    assert _files(fetched) == _files(tiny_dir)
    # a second fetch is served from the cache, without touching the store
    (fetched / "marker").write_text("cached")
    assert (fetch_policy(store, "r1", 0, tmp_path / "cache") / "marker").exists()
    with pytest.raises(ObjectNotFound):
        fetch_policy(store, "r1", 7, tmp_path / "cache")


def test_republish_is_a_no_op_and_first_publisher_wins(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    v1 = publish_policy(store, "r2", 1, tiny_dir, step=1)
    objects = sorted(store.list_keys(keys.policy_prefix("r2", 1)))
    assert publish_policy(store, "r2", 1, tiny_dir, step=1) == v1
    assert sorted(store.list_keys(keys.policy_prefix("r2", 1))) == objects

    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    (other / "config.json").write_text((other / "config.json").read_text() + "\n")
    assert publish_policy(store, "r2", 1, other, step=1) == v1  # a retry that retrained
    manifest = policy_manifest(store, "r2", 1)
    assert manifest is not None and manifest.policy == v1
    assert manifest.files["config.json"].sha256 == _digest(tiny_dir / "config.json")


def test_a_publisher_that_loses_the_race_for_a_version_returns_the_winners(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """B found no manifest, uploaded its blobs, and A's manifest landed before B's: B's
    create-only write is refused and B returns A's version, which the store keeps."""
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    (other / "config.json").write_text((other / "config.json").read_text() + "\n")

    class LandsFirst(ObjectStore):
        won: Any = None

        def put_json(self, key: str, obj: Any, *, create_only: bool = False) -> Any:
            if key.endswith(MANIFEST) and self.won is None:  # A publishes in between
                self.won = publish_policy(store, "r4", 1, tiny_dir, step=1)
            return super().put_json(key, obj, create_only=create_only)

    late = LandsFirst(store.settings, store.bucket)
    lost = publish_policy(late, "r4", 1, other, step=1)
    assert late.won is not None and lost == late.won
    manifest = policy_manifest(store, "r4", 1)
    assert manifest is not None and manifest.policy == late.won
    assert manifest.files["config.json"].sha256 == _digest(tiny_dir / "config.json")
    assert latest_policy(store, "r4") == late.won


def test_latest_only_moves_forward(store: ObjectStore, tiny_dir: Path) -> None:
    publish_policy(store, "r3", 0, tiny_dir)
    v2 = publish_policy(store, "r3", 2, tiny_dir, step=2)
    publish_policy(store, "r3", 1, tiny_dir, step=1)
    assert latest_policy(store, "r3") == v2


def test_a_slow_publisher_of_an_older_version_never_moves_latest_back(
    store: ObjectStore, tiny_dir: Path
) -> None:
    """v1's publisher reads latest (v0), v2's lands before v1's write: the write is a
    compare-and-swap on what was read, so latest stays at v2."""
    v0 = publish_policy(store, "r5", 0, tiny_dir)
    v1 = publish_policy(store, "r5", 1, tiny_dir, step=1)
    v2 = publish_policy(store, "r5", 2, tiny_dir, step=2)
    store.put_json(keys.latest_policy_key("r5"), v0)  # as it was before v1 and v2 advanced it

    class Overtaken(ObjectStore):
        raced = False

        def _race(self, key: str) -> None:
            if key == keys.latest_policy_key("r5") and not self.raced:
                self.raced = True
                advance_latest(store, v2)  # the newer publisher, between read and write

        def get_bytes(self, key: str) -> bytes:
            data = super().get_bytes(key)
            self._race(key)
            return data

        def get_versioned(self, key: str) -> tuple[bytes, str] | None:
            found = super().get_versioned(key)
            self._race(key)
            return found

    slow = Overtaken(store.settings, store.bucket)
    advance_latest(slow, v1)
    assert slow.raced and latest_policy(store, "r5") == v2


@pytest.mark.parametrize("same_size", [False, True])
def test_fetch_rejects_corrupt_object(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path, same_size: bool
) -> None:
    publish_policy(store, "r4", 0, tiny_dir)
    manifest = policy_manifest(store, "r4", 0)
    assert manifest is not None
    key = manifest.files["config.json"].key
    original = store.get_bytes(key)
    corrupt = original.replace(b"{", b"[", 1) if same_size else b"{}"  # one byte, or the size
    store.put_bytes(key, corrupt)  # behind the manifest's back
    with pytest.raises(PolicyIntegrityError, match="config.json"):
        fetch_policy(store, "r4", 0, tmp_path / "cache")
    assert not (tmp_path / "cache" / "r4" / "v0").exists()
    assert not list((tmp_path / "cache" / "r4").iterdir())  # no temp dir left behind
    assert not [p for p in (tmp_path / "cache" / BLOBS).iterdir() if p.name.endswith(".part")]


def test_materialize_from_s3_prefix(store: ObjectStore, tiny_dir: Path, tmp_path: Path) -> None:
    publish_policy(store, "r5", 0, tiny_dir)
    settings = Settings(home=tmp_path)
    local = materialize_base_model(f"s3://{keys.policy_prefix('r5', 0)}", settings, store=store)
    assert _files(local) == _files(tiny_dir)
    plain = "bases/tiny/"
    store.upload_dir(tiny_dir, plain)
    assert _files(materialize_base_model(f"s3://{plain}", settings, store=store)) == _files(
        tiny_dir
    )


@pytest.mark.slow
def test_smollm2_converts_and_writes_python(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = materialize_base_model(SMOLLM2, Settings(home=tmp_path))
    tokenizer: Any = AutoTokenizer.from_pretrained(path)
    assert (
        AutoModelForCausalLM.from_pretrained(path).dtype == torch.float32
    )  # as stored: updates must not round away
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # fast on CPU
    assert model.config.num_hidden_layers == 30
    messages = [{"role": "user", "content": "Write a Python function is_even(n)."}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    text = tokenizer.decode(out[0][inputs["input_ids"].shape[1] :])
    assert "def is_even(" in text


def test_weights_are_written_once_one_shard_per_layer(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch
    import transformers.modeling_utils
    from transformers import AutoModelForCausalLM

    written: list[int] = []

    def counting(real: Any) -> Any:
        def save(tensors: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            written.append(sum(t.numel() * t.element_size() for t in tensors.values()))
            real(tensors, *args, **kwargs)

        return save

    monkeypatch.setattr(safetensors.torch, "save_file", counting(safetensors.torch.save_file))
    monkeypatch.setattr(
        transformers.modeling_utils,
        "safe_save_file",
        counting(transformers.modeling_utils.safe_save_file),
    )
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_dir)
    save_weights(model, tmp_path / "out")

    index = json.loads((tmp_path / "out" / WEIGHTS_INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-embed_tokens.safetensors",
        "model-layer-0000.safetensors",
        "model-layer-0001.safetensors",
        "model-norm.safetensors",
    ]
    assert sum(written) == index["metadata"]["total_size"], "a weight was written twice"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == sorted(
        set(index["weight_map"].values())
    )
    again: Any = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    expected, loaded = model.state_dict(), again.state_dict()
    assert expected.keys() == loaded.keys()
    assert all(expected[name].equal(loaded[name]) for name in expected)
