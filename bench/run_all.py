"""Every benchmark, one after another, each in a subprocess; then the results.json summary.

    .venv/bin/python bench/run_all.py           # quick settings (what `make bench` runs)
    .venv/bin/python bench/run_all.py --full    # the README's settings (SmolLM2, hours)
    .venv/bin/python bench/run_all.py --only orchestration,vs_trl [--allow-busy]

A benchmark that fails (or refuses a busy machine: see `common.require_idle`; `--allow-busy`
is passed on to each) is reported and the others still run; the exit status is then 1. One
whose needs are missing (`server_profile` without `perf`) is skipped and said so. Each
benchmark merges its own key into bench/results.json (`BENCH_RESULTS` elsewhere),
stamped `measured_at`; the summary shows only entries measured since this run started and
marks every other one "stale (measured <when>)", so a failed bench never shows its previous
figures as current. `--full` runs each bench with the options of the command the README's
table cites (vs_trl: `--full`), the bench's defaults where it cites none.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from common import RESULTS, TIME_FORMAT

HERE = Path(__file__).resolve().parent
BENCHES: dict[str, dict[str, list[str]]] = {
    "sandbox": {"quick": ["--runs", "10", "--rounds", "1"], "full": ["--runs", "30"]},
    "orchestration": {"quick": ["--tasks", "16", "--rounds", "2"], "full": ["--rounds", "4"]},
    "concurrency": {"quick": ["--levels", "1000"], "full": ["--levels", "1000,10000"]},
    "episodes": {"quick": ["--steps", "10", "--episodes", "4", "--rounds", "1"], "full": []},
    "vs_trl": {"quick": ["--preset", "tiny", "--target", "0", "--steps", "3"], "full": ["--full"]},
    "engines": {
        "quick": ["--engines", "local", "--no-bare", "--pipeline-engines", "local"],
        "full": ["--engines", "local,vllm", "--pipeline-engines", "local"],
    },
    "decode": {"quick": ["--rows", "16", "--columns", "300", "--steps", "5"], "full": []},
    "prefix": {"quick": ["--tasks", "4", "--rounds", "1"], "full": []},
    # quick: two measured steps / versions, so each order of the two sides is measured once
    "learner": {"quick": ["--steps", "2"], "full": ["--steps", "5"]},
    "publish": {"quick": ["--versions", "3"], "full": []},
    "contention": {
        "quick": ["--spins", "default,20000", "--seconds", "10", "--rounds", "1"],
        "full": [],
    },
    "server_profile": {
        "quick": ["--", "bench/orchestration.py", "--tasks", "8", "--rounds", "1"],
        "full": ["--", "bench/orchestration.py", "--rounds", "2"],
    },
}
"""Each bench's options: `quick` (minutes each) and `full` (the command the README's table cites
for its figures; until 6 December orchestration's was a SmolLM2 run the table never cited)."""
NEEDS = {"server_profile": ["perf", "readelf"]}
"""Programs a bench cannot run without: missing, it is skipped, not failed."""


def when(entry: dict[str, Any]) -> str | None:
    """When an entry was measured: its stamp, else (entries from before the stamp) its machine's."""
    for holder in (entry, entry.get("machine"), entry.get("machine_after")):
        if isinstance(holder, dict) and isinstance(holder.get("measured_at"), str):
            return str(holder["measured_at"])
    return None


def _orchestration(r: dict[str, Any]) -> str:
    return (
        f"{r['tempered_rollouts_per_s']} vs {r['plain_rollouts_per_s']} rollouts/s (Tempered vs "
        f"plain asyncio; {r.get('path', 'tasks started from the client')}) -> Temporal share "
        f"{100 * r['temporal_share']:.1f}% (target <= 10%), {r['workflows_per_s']} workflows/s, "
        f"{1000 * r['server_cpu_s_per_workflow']:.0f} ms server CPU/workflow"
    )


def _sandbox(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{backend} humaneval latency {w['humaneval']['latency_ratio']}x bare, throughput "
        f"{w['humaneval']['throughput_fraction']} of bare"
        for backend, w in r["backends"].items()
    )


def _concurrency(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{row['in_flight']} in flight: {row['start_per_s']} starts/s, "
        f"{row['completion_per_s']} done/s, schedule-to-start p99 "
        f"{row['schedule_to_start_fill_ms']['p99']} ms, "
        f"{row['server_cpu_ms_per_task']['total']} ms server CPU/task"
        for row in r["levels"]
    )


def _episodes(r: dict[str, Any]) -> str:
    snap, flow = r["snapshot"], r["throughput"]
    return (
        f"snapshot {100 * snap['snapshot_share']:.1f}% of a {snap['step_ms']} ms step (with a "
        f"cold restore {100 * snap['snapshot_plus_restore_share']:.0f}%); Temporal/plain steps/s "
        f"{flow['ratio']} (target 0.8)"
    )


def _vs_trl(r: dict[str, Any]) -> str:
    return (
        f"({r['preset']}) {r['measured']}: Tempered/TRL = {r['ratio']} (goal <= {r['goal_ratio']})"
        f"; tempered {r['tempered']['s_per_step']} s/step, trl {r['trl']['s_per_step']} s/step"
    )


def _engines(r: dict[str, Any]) -> str:
    kept = r.get("kept_from_earlier", [])  # parts this run did not measure
    bare = [
        f"{name} {v['tok_s']} tok/s" + (f" = {v['vs_local']}x local" if "vs_local" in v else "")
        for name, v in r.get("bare", {}).items()
        if "bare" not in kept
    ]
    pipe = [
        f"{name} pipeline/bare {v['ratio']}"
        for name, v in r.get("pipeline", {}).items()
        if "pipeline" not in kept
    ]
    return "; ".join(bare + pipe + [f"{part}: stale (an earlier run's)" for part in kept])


def _decode(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{x['rows']}x{x['columns']}: {x['ratio']}x transformers' tok/s" for x in r["runs"]
    )


def _prefix(r: dict[str, Any]) -> str:
    return f"second turns {r['whole_s']} s whole vs {r['prefixes_s']} s from KV = {r['speedup']}x"


def _learner(r: dict[str, Any]) -> str:
    return f"step {r['shared_s']} s prompt shared vs {r['whole_s']} s whole = {r['speedup']}x"


def _publish(r: dict[str, Any]) -> str:
    return (
        f"whole {r['whole']['total_s']} s vs sharded {r['sharded']['total_s']} s a version = "
        f"{r['ratio']}x"
    )


def _contention(r: dict[str, Any]) -> str:
    return ", ".join(f"spin {spin} shared {v['shared']}" for spin, v in r["spins"].items())


def _server_profile(r: dict[str, Any]) -> str:
    return f"{r['samples']} dev-server samples of {' '.join(r['bench'])}"


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "sandbox": _sandbox,
    "orchestration": _orchestration,
    "concurrency": _concurrency,
    "episodes": _episodes,
    "vs_trl": _vs_trl,
    "engines": _engines,
    "decode": _decode,
    "prefix": _prefix,
    "learner": _learner,
    "publish": _publish,
    "contention": _contention,
    "server_profile": _server_profile,
}


def summary(results: dict[str, Any], since: datetime, names: list[str]) -> list[str]:
    """One line per bench of `names`: its figures if measured since `since`, else stale."""
    lines = []
    for name in names:
        entry = results.get(name)
        if not isinstance(entry, dict):
            lines.append(f"{name}: no entry")
            continue
        stamp = when(entry)
        if stamp is None or datetime.strptime(stamp, TIME_FORMAT) < since:
            lines.append(f"{name}: stale (measured {stamp or 'at an unknown time'})")
            continue
        try:
            line = f"{name}: {SUMMARIES[name](entry)}"
        except (KeyError, TypeError) as exc:  # a shape this summary does not know
            line = f"{name}: measured {stamp} (no summary: {exc!r}; see {RESULTS})"
        busy = " [BUSY machine: --allow-busy]" if entry.get("busy") else ""
        lines.append(line + busy)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the README's (long) settings")
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(BENCHES))
    parser.add_argument("--allow-busy", action="store_true", help="passed on to every bench")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(BENCHES)
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {list(BENCHES)}")
    # whole seconds, as the stamps are: an entry stored in this run's first second is fresh
    since = datetime.strptime(time.strftime(TIME_FORMAT), TIME_FORMAT)
    failed, skipped = [], []
    for name in chosen:
        missing = [program for program in NEEDS.get(name, []) if shutil.which(program) is None]
        if missing:
            print(f"== {name}: skipped, needs {', '.join(missing)}", flush=True)
            skipped.append(name)
            continue
        flags = BENCHES[name]["full" if args.full else "quick"]
        busy = ["--allow-busy"] if args.allow_busy else []
        # server_profile: its own options, then after `--` the bench it runs (which checks too)
        flags = [*busy, *flags, *busy] if "--" in flags else [*flags, *busy]
        command = [sys.executable, str(HERE / f"{name}.py"), *flags]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.run(command).returncode
        print(f"== {name}: exit {code} after {time.monotonic() - started:.0f}s", flush=True)
        if code != 0:
            failed.append(name)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    print(f"\n== summary ({RESULTS}; measured since {since.strftime(TIME_FORMAT)})")
    for line in summary(results, since, [n for n in chosen if n not in skipped]):
        print("  " + line)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
