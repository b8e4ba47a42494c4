"""Which stored objects a snapshot's tree names, and which it takes into its own object: the
packing rules of `snapshots.Trees.commit`, apart from its fetching and storing.

    sizes = {entry.sha256: entry.size for entry in entries if entry.kind == "file"}
    kept = still_needed(previous.all_packs(), sizes)       # objects holding some live content
    taken = to_take(kept, sizes, written)                  # [] on most steps

A commit uploads the contents no kept object holds, and those of the objects it takes (each
downloaded, or in the cache of the worker that wrote it). Two rules bound what a restore
fetches: a tree spans at most `MAX_PACKS` objects, and they hold at most twice its live bytes.

- Count: once the kept objects are `MAX_PACKS`, the smallest are taken (by the live bytes they
  hold), and each next one no larger than what is taken so far. A large object (the task's
  initial tree, a step that wrote much) stays where it is until the steps after it wrote as
  much, and a byte taken (unless the count alone forced it) moves into an object at least
  twice as large as the one it leaves: a few times in all. Before, every `MAX_PACKS`th step
  took every object: the whole tree uploaded again (11.5 MB for a step that changed 20 bytes).
- Dead bytes: once the objects hold more than twice the live bytes (files deleted or
  replaced), all are taken: an upload no larger than what died since the last.

The manifest is stored as changes against an earlier snapshot of the episode (skip deltas:
infra/environments/snapshot_chain.py), so a step uploads about what it changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from infra.environments.tree import MAX_PACKS, Pack


def still_needed(packs: list[Pack], sizes: Mapping[str, int]) -> list[Pack]:
    """The objects of `packs` holding some content of `sizes` (digest → size: the tree's)."""
    return [pack for pack in packs if any(digest in sizes for digest, _ in pack.contents)]


def to_take(kept: list[Pack], sizes: Mapping[str, int], written: int) -> list[Pack]:
    """The objects of `kept` that a tree of `sizes`, whose own object holds `written` bytes new
    to `kept`, takes into that object (the module's rules)."""
    held = sum(size for pack in kept for _, size in pack.contents) + written
    if held > 2 * sum(sizes.values()):
        return kept
    if len(kept) < MAX_PACKS:
        return []
    live = {pack.sha256: sum(sizes.get(d, 0) for d, _ in pack.contents) for pack in kept}
    taken: list[Pack] = []
    for pack in sorted(kept, key=lambda pack: live[pack.sha256]):
        if len(kept) - len(taken) < MAX_PACKS and live[pack.sha256] > written:
            break
        taken.append(pack)
        written += live[pack.sha256]
    return taken
