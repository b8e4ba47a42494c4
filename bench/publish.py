"""Publishing a policy version after a learner step: the whole model as one file vs one shard per
layer (only changed shards sent, stored and fetched), side by side in one run.

    .venv/bin/python bench/publish.py [--versions 4] [--layers 6]

One private SeaweedFS (and Temporal, unused) on free ports. SmolLM2-135M-Instruct in float32
(the smollm2 preset; `make train` materialises it) gets, for each version, a small change to
its top `--layers` decoder layers and its final norm (what a default-run step trains). Each
side then does what the learner and an inference worker do for a version:

- `whole`: the live model saved with `save_pretrained` as one `model.safetensors`, published,
  fetched into a cache of its own (until 6 December this side first built a fresh copy from
  the config, as the learner then did: ~2 s of random initialisation a version counted as
  "save", so its figures measured that copy path, not the file format);
- `sharded`: `infra.policy.save_weights` (one shard per layer), published (files the run
  already holds are not sent), fetched into a cache of its own (shared blobs are linked).

The sides alternate which goes first. Printed per side: median seconds per version for save,
publish and fetch (versions 2..N: the first version of a run has nothing to share, so
`--versions` below 2 is refused), MB sent per version, and the cache's size after N versions;
the ratio is whole over sharded seconds.
Merged into bench/results.json under "publish". Not covered: the learner's gather of ZeRO-3
partitions (the same on both sides) and a remote S3's bandwidth (here it is loopback). It
refuses a busy machine (`common.require_idle`, and after each side's version if other
processes took the cores; `--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    add_busy_flag,
    bench_stack,
    idle_side,
    machine,
    median_of,
    merge_results,
    require_idle,
)

from infra.base_models import materialize_base_model
from infra.policy import policy_manifest, publish_policy, save_weights
from infra.policy_cache import BLOBS, fetch_policy
from infra.settings import Settings
from infra.storage import ObjectStore

MB = 1 << 20
SIDES = ("whole", "sharded")
MEASURED_FROM = 2
"""The first version measured: version 1 has nothing to share."""


def side_order(version: int) -> tuple[str, ...]:
    """The sides in the order `version` runs them: they take turns first, so a run measures
    both orders only from 3 versions (versions 2 and 3)."""
    return SIDES if version % 2 else SIDES[::-1]


def _copy_side_files(base: Path, out: Path) -> None:
    for path in base.iterdir():  # tokenizer, chat template: as the learner copies them
        if path.is_file() and not (out / path.name).exists() and "safetensors" not in path.name:
            shutil.copy2(path, out / path.name)


def _save_whole(model: Any, out: Path) -> None:
    model.save_pretrained(out)  # the format alone: no copy built, as `sharded` builds none


def _save_sharded(model: Any, out: Path) -> None:
    save_weights(model, out, {k: v.detach() for k, v in model.state_dict().items()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; fewer than 2 `--versions` are refused (versions 2..N are measured)."""
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--versions", type=int, default=4, help="versions published (2..N measured: at least 2)"
    )
    parser.add_argument("--layers", type=int, default=6)
    add_busy_flag(parser)
    args = parser.parse_args(argv)
    if args.versions < MEASURED_FROM:
        parser.error(
            f"--versions must be at least 2, not {args.versions}: the first version has nothing "
            "to share, so versions 2..N are what is measured"
        )
    return args


def main() -> None:
    args = parse_args()
    require_idle(args.allow_busy)
    import torch
    from transformers import AutoModelForCausalLM

    base = materialize_base_model("smollm2", Settings())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    sides = dict(zip(SIDES, (_save_whole, _save_sharded), strict=True))
    times: dict[str, dict[str, list[float]]] = {
        s: {"save": [], "publish": [], "fetch": []} for s in sides
    }
    sent: dict[str, list[float]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as tmp, bench_stack(Path(tmp) / "home") as settings:
        store = ObjectStore.from_settings(settings)
        known: dict[str, set[str]] = {s: set() for s in sides}
        for version in range(1, args.versions + 1):
            with torch.no_grad():
                for layer in model.model.layers[-args.layers :]:
                    for param in layer.parameters():
                        param.add_(1e-3)
                model.model.norm.weight.add_(1e-3)
            for side in side_order(version):
                out = Path(tmp) / f"{side}-v{version}"
                with idle_side(f"{side} v{version}"):
                    started = time.perf_counter()
                    sides[side](model, out)
                    _copy_side_files(base, out)
                    saved = time.perf_counter()
                    publish_policy(store, side, version, out, step=version)
                    published = time.perf_counter()
                    fetch_policy(store, side, version, Path(tmp) / f"cache-{side}", keep=6)
                    fetched = time.perf_counter()
                shutil.rmtree(out)
                manifest = policy_manifest(store, side, version)
                assert manifest is not None
                new = [ref for ref in manifest.files.values() if ref.key not in known[side]]
                known[side] |= {ref.key for ref in new}
                if version >= MEASURED_FROM:
                    times[side]["save"].append(saved - started)
                    times[side]["publish"].append(published - saved)
                    times[side]["fetch"].append(fetched - published)
                    sent[side].append(sum(ref.size for ref in new) / MB)
        report: dict[str, Any] = {
            "machine": machine(),
            "versions": args.versions,
            "layers": args.layers,
        }
        for side in sides:
            cache = Path(tmp) / f"cache-{side}" / BLOBS
            parts = {k: round(median_of(v), 2) for k, v in times[side].items()}
            report[side] = {
                **{f"{k}_s": v for k, v in parts.items()},
                "total_s": round(sum(parts.values()), 2),
                "sent_mb_per_version": round(median_of(sent[side]), 1),
                "cache_mb": round(sum(p.stat().st_size for p in cache.iterdir()) / MB),
            }
            print(f"{side:8s} {report[side]}", flush=True)
        report["ratio"] = round(report["whole"]["total_s"] / report["sharded"]["total_s"], 2)
        print(f"whole / sharded seconds per version: {report['ratio']}x", flush=True)
    merge_results("publish", report)


if __name__ == "__main__":
    main()
