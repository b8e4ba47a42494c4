"""Inference and the learner on the same cores: how long torch's OpenMP threads spin matters.

    .venv/bin/python bench/contention.py [--spins default,20000,0] [--seconds 20] [--rounds 2]

A default run on a small machine decodes (inference worker), trains (learner worker) and runs
sandboxes at once, each torch process with one OpenMP thread per core. libgomp's threads spin
(GOMP_SPINCOUNT, 300,000 turns by default) before they sleep, waiting for the next parallel
region: alone that saves a wake-up per op; beside another busy process a spinning thread burns
the core its neighbour's threads need. For each spin count this bench runs, in fresh processes
(libgomp reads the variable when torch loads it), with SmolLM2-135M (the smollm2 preset):

  generate   the local backend's `RowBatch`: 32 rows, prompts of 100..300 tokens, 40 greedy
             tokens each, prefill included, over and over (tokens out / s);
  train      forward and backward of 4 x 400 tokens with the top 6 of 30 layers trainable, as
             the preset's learner trains (tokens / s);

each alone, then both together. Every process starts at one signal and works until one
shared deadline (`--seconds` after it); each counts only the units of work it finished by then
(a decode step of the batch, a call's prefill in its first; a forward and backward), over the
time to its last such unit, so no side is credited with work it did alone after the other
stopped. (Until 6 December each process ran whole calls until its own `--seconds` were up,
and a decode call, 25-32 s beside training, outlasted the window: decode then ran alone at
the end and "together" counted that.) A side that dies before the start ends the
measurement and the other side with it; a side left waiting gives up when the start file's
folder is gone, its parent changes or `WAIT_S` pass (until 7 December it waited for ever, its
model resident). Rounds alternate the order of the spin counts. Printed and
merged into bench/results.json under "contention": each side's tokens/s alone and together,
and `shared`, the two together as fractions of their alone speed at the default spin, summed
(1.0 = sharing the cores lost nothing; 2 cores shared by two 2-thread processes ideally give
about 1.0). What `Settings.omp_spin_count` sets is chosen from it. Not covered: the
sandboxes' and the Temporal server's share of the cores in a real run (they only add to the
contention); GPUs (no OpenMP in the hot loop). It refuses a busy machine (`common.require_idle`,
and after each measured run if other processes took the cores: this bench is about sharing
them; `--allow-busy` measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import (  # first: puts the repo root on sys.path
    add_busy_flag,
    idle_side,
    machine,
    median_of,
    merge_results,
    require_idle,
)

ROLES = ("generate", "train")
WAIT_S = 900.0
"""How long a ready side waits for the start before it gives up (the other side loads
SmolLM2 and runs a whole warm-up call meanwhile: well under a minute on 2 cores)."""


def role_main(role: str, start_file: Path) -> None:
    """One side, in its own process: prepare, wait for `start_file` (it holds the shared
    deadline, on the machine-wide monotonic clock), work until the deadline, print tokens/s."""
    from infra.base_models import materialize_base_model
    from infra.settings import Settings

    parent = os.getppid()
    path = str(materialize_base_model("smollm2", Settings()))
    work = _generate(path) if role == "generate" else _train(path)
    for _ in work():  # warm: one whole call
        pass
    rate = rate_until(work, wait_for_start(start_file, role, parent=parent))
    print("none" if rate is None else f"{rate:.2f}", flush=True)


def wait_for_start(
    start_file: Path, role: str, parent: int | None = None, timeout: float = WAIT_S
) -> float:
    """Say `role` is ready, then wait for `start_file`; returns the deadline it holds.
    SystemExit instead when no start can come: its directory is gone (measure has ended, the
    other side died), the process that started this one is no longer its parent, or `timeout`
    seconds have passed (a side left waiting used to poll for ever, its model resident)."""
    start_file.with_suffix(f".{role}").touch()
    given_up = time.monotonic() + timeout
    while not start_file.exists():
        if not start_file.parent.is_dir():
            raise SystemExit(f"{role}: {start_file.parent} is gone: no start will come")
        if parent is not None and os.getppid() != parent:
            raise SystemExit(f"{role}: the process that started it (pid {parent}) is gone")
        if time.monotonic() > given_up:
            raise SystemExit(f"{role}: no start within {timeout:.0f} s")
        time.sleep(0.01)
    return float(start_file.read_text())


def rate_until(work: Callable[[], Iterator[int]], deadline: float) -> float | None:
    """Run `work` calls until `deadline` (time.monotonic) passes; tokens/s of the units that
    finished by then, over the time to the last of them (None: none finished)."""
    started = time.monotonic()
    tokens, counted_until, now = 0, started, started
    while now < deadline:
        for made in work():
            now = time.monotonic()
            if now > deadline:  # finished after the other side may have stopped: not counted
                break
            tokens, counted_until = tokens + made, now
        now = time.monotonic()  # a call that yielded nothing still moves the clock on
    return tokens / (counted_until - started) if tokens else None


def _generate(path: str) -> Any:
    import random

    import torch

    from contracts.task import SamplingParams
    from infra.inference.decoder import RowBatch
    from infra.inference.local import _choose, load_policy

    policy = load_policy(path, torch.device("cpu"))
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, 40_000) for _ in range(rng.randint(100, 300))] for _ in range(32)
    ]

    def work() -> Iterator[int]:
        """One call: prefill the 32 rows, then yield each decode step's tokens as it ends."""
        batch = RowBatch(policy, _choose)
        batch.eos_ids = frozenset()  # every row decodes its 40 tokens
        params = SamplingParams(temperature=0.0, max_new_tokens=40)
        batch.admit([batch.row(p, params) for p in prompts])
        while batch.rows:
            made = len(batch.rows)
            batch.step()
            yield made

    return work


def _train(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(any(f"layers.{i}." in name for i in range(24, 30)))
    ids = torch.randint(100, 40_000, (4, 400), generator=torch.Generator().manual_seed(0))

    def work() -> Iterator[int]:
        """One call: a forward and backward, yielding its tokens when it ends."""
        logits = model(input_ids=ids).logits
        logits.log_softmax(-1).mean().backward()
        yield int(ids.numel())

    return work


def measure(roles: tuple[str, ...], spin: str, seconds: float) -> dict[str, float]:
    """tokens/s of each of `roles`, run side by side with GOMP_SPINCOUNT `spin` until one
    deadline `seconds` after they start."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin != "default":
        env["GOMP_SPINCOUNT"] = spin
    procs: dict[str, subprocess.Popen[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp) / "start"
        try:
            for role in roles:
                procs[role] = subprocess.Popen(
                    [sys.executable, __file__, "--role", role, "--start-file", str(start)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            while not all(start.with_suffix(f".{r}").exists() for r in roles):
                if any(p.poll() is not None for p in procs.values()):
                    raise SystemExit(f"a {'/'.join(roles)} process died before it started")
                time.sleep(0.05)
            ready = start.with_suffix(".deadline")  # written whole, then renamed: read at once
            ready.write_text(repr(time.monotonic() + seconds))
            ready.replace(start)
            rates = {role: p.communicate()[0].split()[-1] for role, p in procs.items()}
        finally:  # whatever ended the measurement, no side outlives it
            for process in procs.values():
                if process.poll() is None:
                    process.kill()
                process.wait()
    if "none" in rates.values():
        raise SystemExit(f"{spin}: no unit of work finished within {seconds} s: raise --seconds")
    return {role: float(rate) for role, rate in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spins", default="default,20000,0")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--start-file", type=Path, help=argparse.SUPPRESS)
    add_busy_flag(parser)
    args = parser.parse_args()
    if args.role:
        return role_main(args.role, args.start_file)
    require_idle(args.allow_busy)
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be above 0 and --rounds at least 1")
    spins = args.spins.split(",")
    samples: dict[str, dict[str, list[float]]] = {s: {} for s in spins}
    for round_index in range(args.rounds):
        for spin in spins if round_index % 2 == 0 else spins[::-1]:
            figures = {}
            for role in ROLES:
                with idle_side(f"{role} alone, spin {spin}"):
                    figures[f"{role}_alone"] = measure((role,), spin, args.seconds)[role]
            with idle_side(f"together, spin {spin}"):
                together = measure(ROLES, spin, args.seconds)
            figures |= {f"{r}_together": together[r] for r in ROLES}
            for key, value in figures.items():
                samples[spin].setdefault(key, []).append(value)
            print(
                f"round {round_index} spin {spin:>7}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()),
                flush=True,
            )
    medians = {s: {k: median_of(v) for k, v in f.items()} for s, f in samples.items()}
    base = medians[spins[0]]
    report: dict[str, Any] = {"machine": machine(), "seconds": args.seconds, "spins": {}}
    print(
        f"tokens/s, medians of {args.rounds} rounds; shared = together / {spins[0]} alone, summed"
    )
    for spin, m in medians.items():
        shared = sum(m[f"{r}_together"] / base[f"{r}_alone"] for r in ROLES)
        report["spins"][spin] = {
            **{k: round(v, 1) for k, v in m.items()},
            "shared": round(shared, 3),
        }
        print(
            f"  spin {spin:>7}: generate {m['generate_alone']:6.1f} alone "
            f"{m['generate_together']:6.1f} together | train {m['train_alone']:6.1f} alone "
            f"{m['train_together']:6.1f} together | shared {shared:.2f}",
            flush=True,
        )
    merge_results("contention", report)


if __name__ == "__main__":
    main()
