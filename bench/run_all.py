"""Every benchmark, one after another, each in a subprocess; then the bench/results.json summary.

    .venv/bin/python bench/run_all.py           # quick settings (minutes; what `make bench` runs)
    .venv/bin/python bench/run_all.py --full    # the real ones (SmolLM2, long: an hour or more)
    .venv/bin/python bench/run_all.py --only orchestration,vs_trl

A benchmark that fails is reported and the others still run; the exit status is then 1.
Each benchmark merges its own key into bench/results.json (see bench/common.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS

HERE = Path(__file__).resolve().parent
BENCHES: dict[str, dict[str, list[str]]] = {
    "sandbox": {"quick": ["--runs", "10"], "full": ["--runs", "30"]},
    "orchestration": {
        "quick": ["--tasks", "16", "--rounds", "2"],
        "full": [
            "--model",
            "smollm2",
            "--tasks",
            "16",
            "--group-size",
            "8",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "160",
            "--rounds",
            "2",
        ],
    },
    "concurrency": {
        "quick": ["--levels", "1000"],
        "full": ["--levels", "1000,2500,5000,10000"],
    },
    "vs_trl": {
        "quick": ["--preset", "tiny", "--target", "0", "--steps", "3"],
        "full": ["--preset", "smollm2", "--steps", "30", "--gain", "0.1"],
    },
}


def summary(results: dict[str, Any]) -> list[str]:
    """One or a few lines per benchmark: the ratios each one is about."""
    lines = []
    for backend, workloads in results.get("sandbox", {}).get("backends", {}).items():
        he = workloads.get("humaneval", {})
        lines.append(
            f"sandbox/{backend}: humaneval latency {he.get('latency_ms')} ms = "
            f"{he.get('latency_ratio')}x bare, throughput {he.get('throughput_fraction')} of bare"
        )
    orch = results.get("orchestration")
    if orch:
        lines.append(
            f"orchestration: {orch['tempered_rollouts_per_s']} vs {orch['plain_rollouts_per_s']} "
            f"rollouts/s (Tempered vs plain asyncio) -> Temporal share "
            f"{100 * orch['temporal_share']:.1f}% "
            f"(target <= 10%), {orch['workflows_per_s']} workflows/s, "
            f"{1000 * orch['server_cpu_s_per_workflow']:.0f} ms server CPU/workflow, "
            f"load {orch['machine']['load_average']}"
        )
    for row in results.get("concurrency", {}).get("levels", []):
        lines.append(
            f"concurrency: {row['in_flight']} in flight, {row['start_per_s']} starts/s, "
            f"{row['completion_per_s']} done/s, schedule-to-start p99 "
            f"{row['schedule_to_start_fill_ms']['p99']} ms, "
            f"{row['server_cpu_ms_per_task']['total']} ms server CPU/task, "
            f"{row['worker_mb_per_1000_in_flight']} MB/1k in flight"
        )
    trl = results.get("vs_trl")
    if trl:
        lines.append(
            f"vs_trl ({trl['preset']}): {trl['measured']}: Tempered/TRL = {trl['ratio']} "
            f"(goal <= {trl['goal_ratio']}); tempered {trl['tempered']['s_per_step']} s/step, "
            f"trl {trl['trl']['s_per_step']} s/step, load {trl['machine']['load_average']}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the real (long) settings")
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(BENCHES))
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(BENCHES)
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {list(BENCHES)}")
    failed = []
    for name in chosen:
        flags = BENCHES[name]["full" if args.full else "quick"]
        command = [sys.executable, str(HERE / f"{name}.py"), *flags]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.run(command).returncode
        print(f"== {name}: exit {code} after {time.monotonic() - started:.0f}s", flush=True)
        if code != 0:
            failed.append(name)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    print("\n== summary (" + str(RESULTS) + ")")
    for line in summary(results):
        print("  " + line)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
