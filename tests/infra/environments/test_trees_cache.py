"""`Trees`' caches: decoded manifests are bounded by their estimated bytes, as contents are,
and readers that queue on one fetch share its result, even one too large to keep.

Before, manifests were kept by count (1,024 of up to 100,000 entries: some 780 B an entry, so
tens of GB), and the readers queued on the fetch of a tree over a quarter of the cache each
fetched it again, one after another.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from contracts.common import ObjectRef
from infra.environments.lru import Lru
from infra.environments.snapshots import MemoryObjects, Trees, manifest_bytes
from infra.environments.tree import Entry, File, Manifest, manifest_ref, pack_files, sha256

READERS = 8


class Counted(MemoryObjects):
    """Objects whose GETs are counted, each taking `delay_s`."""

    def __init__(self, objects: dict[str, bytes], delay_s: float = 0.0) -> None:
        super().__init__(objects)
        self.delay_s, self.gets = delay_s, 0

    def get(self, key: str) -> bytes:
        self.gets += 1
        time.sleep(self.delay_s)
        return super().get(key)


def tree(
    entries: int, executable: bool = False, prefix: str = "node_modules/pkg/lib",
    mode: int | None = None,
) -> tuple[Manifest, ObjectRef, bytes]:  # fmt: skip
    """A manifest of `entries` files, each of its own content (and `mode`), with times; its ref
    and bytes."""
    files = {f"{prefix}/module_{n:06d}.js": File(b"%d" % n, executable) for n in range(entries)}
    packed = pack_files(files).manifest
    listing = [
        Entry(**{**e.model_dump(exclude_defaults=True), "mode": mode}) if e.kind == "file" else e
        for e in packed.entries
    ]
    timed = Manifest(entries=listing, inline=packed.inline, mtimes=[1] * entries)
    ref, data = manifest_ref(timed, {sha256(f.data): f.data for f in files.values()})
    return timed, ref, data


def decoded_bytes(manifest: Manifest) -> int:
    """What a copy of `manifest` decoded from its stored JSON takes in memory."""
    stored = manifest.model_dump_json(exclude_defaults=True)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy = Manifest.model_validate_json(stored)
        gc.collect()
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert copy.entries == manifest.entries and copy.mtimes == manifest.mtimes
    return taken


@pytest.mark.parametrize(
    ("entries", "executable", "prefix", "mode"),
    [
        (5_000, False, "node_modules/pkg/lib", None),
        (5_000, True, "bin", None),
        (2_000, False, "d" * 200, None),
        (5_000, False, "secrets", 0o600),
    ],
)
def test_the_estimate_covers_what_a_decoded_manifest_takes(
    entries: int, executable: bool, prefix: str, mode: int | None
) -> None:
    manifest, _, _ = tree(entries, executable, prefix, mode)
    taken = decoded_bytes(manifest)
    assert taken <= manifest_bytes(manifest) <= 1.5 * taken


def test_manifests_are_kept_by_their_bytes() -> None:
    stored = [tree(100, prefix=f"p{n}") for n in range(6)]
    objects = Counted({ref.key: data for _, ref, data in stored})
    refs = [ref for _, ref, _ in stored]
    size = manifest_bytes(stored[0][0])
    trees = Trees(objects, cache_bytes=4 * size + size // 2)  # four fit
    try:
        for ref in refs:
            trees.get_manifest(ref)
        assert objects.gets == 6
        trees.get_manifest(refs[-1])  # kept
        assert objects.gets == 6
        trees.get_manifest(refs[0])  # the least recently used: out
        assert objects.gets == 7
        large = Trees(objects, cache_bytes=4 * size - 1)  # over a quarter: never kept
        for _ in range(2):
            large.get_manifest(refs[0])
        assert objects.gets == 9
        large.close()
    finally:
        trees.close()


def _concurrently(read: Callable[[], object]) -> None:
    with ThreadPoolExecutor(READERS) as pool:
        list(pool.map(lambda _: read(), range(READERS)))


def test_readers_queued_on_a_tree_too_large_to_keep_share_one_fetch() -> None:
    packed = pack_files({"big.bin": bytes(range(256)) * 4096})  # 1 MB
    objects = Counted(packed.objects, delay_s=0.2)
    trees = Trees(objects, cache_bytes=2 << 20)  # a quarter: 512 kB, so never kept
    try:
        _concurrently(lambda: trees.get_manifest(packed.ref))
        assert objects.gets == 1  # the group's G opens: one GET
        manifest = trees.get_manifest(packed.ref)
        objects.gets = 0
        _concurrently(lambda: trees.get_contents(manifest))
        assert objects.gets == 1
        trees.get_contents(manifest)  # a later reader fetches it again: it is not kept
        assert objects.gets == 2
    finally:
        trees.close()


def test_a_failed_load_hands_nothing_on() -> None:
    """Each reader that waited on it loads on its own (its own error, or its value)."""
    cache: Lru[str] = Lru(1 << 20)
    started, go_on = threading.Event(), threading.Event()
    loads: list[int] = []

    def load() -> str:
        loads.append(1)
        if len(loads) == 1:
            started.set()
            go_on.wait(5)
            raise OSError("the store is down")
        return "value"

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(cache.load, "k", load, len)
        started.wait(5)
        waiting = [pool.submit(cache.load, "k", load, len) for _ in range(2)]
        time.sleep(0.1)
        go_on.set()
        with pytest.raises(OSError, match="down"):
            first.result()
        assert [w.result() for w in waiting] == ["value", "value"]
    assert len(loads) == 2 and cache.held == 5  # the second load kept it; the third took it
