"""A version fetched with `pinned_policy` stays cached while the block runs: the learner loads a
LoRA version with its adapter pinned while it fetches the base (real SeaweedFS;
infra/policy_cache.py).

The learner fetched the adapter, then its base, pinning neither: with `keep` versions cached
and the older ones pinned by inference workers, the base's fetch evicted the adapter the
learner was about to load."""

from __future__ import annotations

from pathlib import Path

from infra.policy import MANIFEST, publish_policy
from infra.policy_cache import fetch_policy, pin, pinned_policy, unpin
from infra.storage import ObjectStore
from tests.fixtures.policy_dirs import WEIGHTS, version_dir

KEEP = 3


def _adapter(tmp_path: Path, tag: str) -> Path:
    """A LoRA version's files (never loaded here: the cache only moves them)."""
    out = tmp_path / f"adapter-{tag}"
    out.mkdir()
    (out / "adapter_config.json").write_text(f'{{"tag": "{tag}"}}')
    (out / "adapter_model.safetensors").write_text(tag)
    return out


def _lora_run(store: ObjectStore, tmp_path: Path) -> None:
    """v0: full weights; v1..v3: adapters over v0."""
    publish_policy(store, "r", 0, version_dir(tmp_path, "base"))
    for version in (1, 2, 3):
        publish_policy(
            store, "r", version, _adapter(tmp_path, f"a{version}"), step=version, adapter_of=0
        )


def test_the_adapter_stays_while_its_base_is_fetched(store: ObjectStore, tmp_path: Path) -> None:
    _lora_run(store, tmp_path)
    cache = tmp_path / "cache"
    pins = []  # inference workers serving v1 and v2 pin them and their base
    for version in (1, 0, 2):
        pins.append(pin(fetch_policy(store, "r", version, cache, KEEP)))
    assert None not in pins
    with (  # the learner, at step 3: the adapter, then its base
        pinned_policy(store, "r", 3, cache, KEEP) as adapter,
        pinned_policy(store, "r", 0, cache, KEEP) as base,
    ):
        assert (adapter / MANIFEST).is_file() and (adapter / "adapter_config.json").is_file()
        assert (base / WEIGHTS).read_text() == "base"
    for fd in pins:
        unpin(fd)  # type: ignore[arg-type]
    # unpinned, the adapter is the cache's to evict again
    fetch_policy(store, "r", 1, cache, keep=2)
    assert not (cache / "r" / "v3").exists()


def test_a_pinned_adapter_survives_room_made_for_its_base(
    store: ObjectStore, tmp_path: Path
) -> None:
    _lora_run(store, tmp_path)
    cache = tmp_path / "cache"
    fetch_policy(store, "r", 1, cache, keep=2)  # cached: v1 and its base v0
    with pinned_policy(store, "r", 3, cache, keep=2) as adapter:
        fetch_policy(store, "r", 2, cache, keep=2)  # an inference worker meanwhile
        assert (adapter / "adapter_model.safetensors").read_text() == "a3"
        with pinned_policy(store, "r", 0, cache, keep=2) as base:
            assert (adapter / "adapter_model.safetensors").read_text() == "a3"
            assert (base / WEIGHTS).read_text() == "base"
