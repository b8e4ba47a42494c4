"""PolicyResolver against a real SeaweedFS: pinned versions not published yet are waited for
(bounded), versions that were skipped fail at once, LoRA versions carry their base (kept
in the bounded cache while adapters over it are), the bounded cache evicts the least recently
used version but none a request still holds, and a version it evicted is fetched again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from infra.inference import InferenceError, PolicyHandle, PolicyResolver
from infra.policy import publish_policy
from infra.storage import ObjectStore
from tests.infra.inference.policies import publish_adapter
from tests.infra.test_policy_cache import counted_builds


async def request(policies: PolicyResolver, run_id: str, version: int) -> PolicyHandle:
    """`resolve` as an activity calls it, in a task of its own: the handle's pins go when the task
    ends (the sleep lets that task's done callbacks run)."""
    handle = await asyncio.create_task(policies.resolve(run_id, version))
    await asyncio.sleep(0)
    return handle


@pytest.mark.asyncio
async def test_a_pinned_version_is_waited_for_until_it_is_published(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    publish_policy(store, "wait", 0, tiny_dir)
    policies = PolicyResolver(store, tmp_path, latest_ttl_s=0.2, wait_s=60)
    asked = asyncio.create_task(policies.resolve("wait", 1))
    await asyncio.sleep(1.0)
    assert not asked.done()
    await asyncio.to_thread(publish_policy, store, "wait", 1, tiny_dir, 1)
    handle = await asyncio.wait_for(asked, 30)
    assert (handle.version, handle.base) == (1, None)
    assert (handle.path / "config.json").is_file()


@pytest.mark.asyncio
async def test_the_wait_is_bounded_and_a_skipped_version_fails_at_once(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    publish_policy(store, "late", 0, tiny_dir)
    policies = PolicyResolver(store, tmp_path, latest_ttl_s=0.1, wait_s=0.5)
    with pytest.raises(InferenceError, match=r"v.* 2 of run 'late' was not published within 0s"):
        await policies.resolve("late", 2)
    publish_policy(store, "late", 3, tiny_dir, step=3)  # version 2 was skipped for good
    started = time.monotonic()
    with pytest.raises(InferenceError, match="was never published \\(the newest is v3\\)") as err:
        await PolicyResolver(store, tmp_path, wait_s=60).resolve("late", 2)
    assert not err.value.retryable and time.monotonic() - started < 10


@pytest.mark.asyncio
async def test_concurrent_requests_for_an_unpublished_version_share_one_bound(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """The k-th of k requests waiting for one version waited k times the bound (each started
    its clock once it took the version's lock): with the defaults, later requests hit the
    activity's timeout and were retried for ever instead of failing with the clear error."""
    publish_policy(store, "queued", 0, tiny_dir)
    policies = PolicyResolver(store, tmp_path, latest_ttl_s=0.05, wait_s=0.5)
    started = time.monotonic()

    async def waited() -> float:
        with pytest.raises(InferenceError, match="not published within") as err:
            await policies.resolve("queued", 1)
        assert not err.value.retryable
        return time.monotonic() - started

    assert max(await asyncio.gather(*(waited() for _ in range(4)))) < 1.0


@pytest.mark.asyncio
async def test_a_lora_version_resolves_with_its_full_weight_base(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"not read here")
    publish_policy(store, "lora", 0, tiny_dir)
    publish_adapter(store, "lora", 1, adapter, adapter_of=0)
    policies = PolicyResolver(store, tmp_path / "cache")
    tuned = await policies.resolve("lora", None)  # the newest: the adapter
    assert tuned.version == 1 and tuned.base == await policies.resolve("lora", 0)
    assert tuned.weights.path / "config.json" != tuned.path / "config.json"
    assert (tuned.path / "adapter_config.json").is_file()


@pytest.mark.asyncio
async def test_a_version_the_bounded_cache_evicted_is_fetched_again(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    for version in (0, 1):
        publish_policy(store, "evict", version, tiny_dir, step=version)
    policies = PolicyResolver(store, tmp_path / "cache", keep=1)
    first = await request(policies, "evict", 0)
    await request(policies, "evict", 1)  # the cache keeps one version: v0's directory goes
    assert not first.path.exists()
    again = await request(policies, "evict", 0)
    assert again.path == first.path and (again.path / "config.json").is_file()


@pytest.mark.asyncio
async def test_the_base_of_new_adapter_versions_stays_cached(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_policy(store, "bases", 0, tiny_dir)
    for version in range(1, 7):
        adapter = tmp_path / f"adapter{version}"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(f'{{"r": {version}}}')
        publish_policy(store, "bases", version, adapter, step=version, adapter_of=0)
    built = counted_builds(monkeypatch)
    policies = PolicyResolver(store, tmp_path / "cache", keep=3)
    base = await policies.resolve("bases", 0)
    for version in range(1, 7):  # a run training LoRA: each new version over the same base
        tuned = await policies.resolve("bases", version)
        assert tuned.base == base and base.on_disk()
    assert built.count("v0") == 1  # the full weights were downloaded once


@pytest.mark.asyncio
async def test_the_version_in_use_outlives_one_used_once(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    publish_policy(store, "serving", 0, tiny_dir)
    for version in (0, 1):
        publish_policy(store, "training", version, tiny_dir, step=version)
    policies = PolicyResolver(store, tmp_path / "cache", keep=2)
    hot = await request(policies, "serving", 0)
    cold = await request(policies, "training", 0)  # fetched once, never asked for again
    for _ in range(3):  # requests keep resolving the serving version: cache hits
        assert await request(policies, "serving", 0) is hot
    await request(policies, "training", 1)  # one version more than the cache keeps
    assert hot.on_disk() and not cold.on_disk()


@pytest.mark.asyncio
async def test_a_version_a_request_still_reads_is_not_evicted(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    for version in range(3):
        publish_policy(store, "held", version, tiny_dir, step=version)
    policies = PolicyResolver(store, tmp_path / "cache", keep=1)
    resolved, loaded = asyncio.Event(), asyncio.Event()

    async def slow_request() -> str:
        handle = await policies.resolve("held", 0)
        resolved.set()
        await loaded.wait()  # the backend reads the version's files only now
        return (handle.path / "config.json").read_text()

    slow = asyncio.create_task(slow_request())
    await resolved.wait()
    await request(policies, "held", 1)  # the cache keeps one version: v0 is in use
    loaded.set()
    assert (await slow).startswith("{")
    await asyncio.sleep(0)  # the slow request's pins go
    held = await request(policies, "held", 2)
    assert [p.name for p in held.path.parent.iterdir()] == ["v2"]
