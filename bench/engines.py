"""Inference engines at the default run's batch shape: vLLM-CPU vs transformers, bare and in the
pipeline, side by side in one run.

    .venv/bin/python bench/engines.py [--engines local,vllm,vllm-nolora,vllm-compiled]
        [--reps 2] [--no-bare] [--no-pipeline] [--pipeline-engines local,vllm]

The shape is the smollm2 preset's first GENERATE wave: `concurrency` (8) starter tasks ×
`group_size` (6) samples = 48 rows, each prompt the chat-rendered task (the activity's own
`ChatFormat`), the preset's sampling (T=0.9, at most 128 new tokens, stop after the code block)
with top-p 1 (the preset's 0.95 the vllm backend refuses: it records log-probs after top-p,
`infra/inference/vllm.py`), each row seeded as the activity seeds it. Rows therefore end at different lengths,
as in a run.

1. Engine vs engine, bare: each engine's backend gets the 48 rows in one call (transformers:
   `infra.inference.local`, one static batch; vLLM: `infra.inference.vllm` eager, as
   `vllm` with LoRA served (the default settings) and `vllm-nolora` without, and
   `vllm-compiled` with torch.compile). One vLLM engine at a time (each holds gigabytes) takes
   turns with transformers, `--reps` rounds each, so every vLLM figure has its paired
   transformers figure under the same load, and each variant is reported against its own
   paired runs (`local_tok_s`, `vs_local`; until 6 December against the median of every
   transformers run of the bench, whatever the load beside the other variants).
2. In the pipeline: a private stack (Temporal dev server + SeaweedFS on free ports), the
   production inference worker of each engine in this process (`inference.backend` = it), and
   one small workflow per task whose only step is the task's GENERATE activity, all 8 at once:
   Temporal → activity → batcher → backend. The same worker's backend is then called bare with
   the very same rows and seeds; tokens/s in the pipeline over bare is the ratio (target 0.8).
   Both sides must sample the same tokens: each row's count of sampled tokens is checked, run
   by run, against the first run's, and a mismatch stops the bench (before 6 December nothing
   checked it, so a ratio could set unlike work side by side).

Every figure is printed with the load average at its start (the machine is shared) and merged
into bench/results.json under "engines". vLLM needs the `vllm` extra (`make setup`). It refuses
a busy machine (`common.require_idle`, judged again after every measured run; `--allow-busy`
measures anyway, marked `busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from common import (
    RESULTS,
    ROOT,
    add_busy_flag,
    bench_stack,
    idle_side,
    machine,
    median_of,
    merge_results,
    production_workers,
    require_idle,
)
from temporalio import workflow
from temporalio.worker import Worker

from contracts.names import Activity, Queue
from contracts.rollout import GenerateItem, GenerateRequest, GenerateResponse
from contracts.task import EnvName, SamplingParams, TaskSpec
from infra.inference import PolicyHandle
from infra.settings import InferenceSettings, Settings, VLLMSettings

POLICY_RUN = "bench-engines"
BENCH_QUEUE = "bench-engines"
SEED = 1234
Row = tuple[str, int]
"""(task id, sample): one row of the wave."""


@workflow.defn(name="BenchGenerate", sandboxed=False)
class BenchGenerate:
    """One task's first GENERATE, through Temporal like AgentTaskWorkflow's."""

    @workflow.run
    async def run(self, request: GenerateRequest) -> GenerateResponse:
        return await workflow.execute_activity(
            Activity.GENERATE.value,
            request,
            result_type=GenerateResponse,
            task_queue=Queue.INFERENCE.value,
            start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(minutes=2),
        )


class Shape:
    """The default run's first wave: tasks, samples, sampling, and each row's params."""

    def __init__(self) -> None:
        from infra.presets import load_preset
        from infra.tasks import load_suite

        preset = load_preset("smollm2")
        self.group = preset.group_size
        self.sampling = preset.sampling.model_copy(update={"seed": SEED, "top_p": 1.0})
        self.max_context = preset.max_context_tokens
        self.tasks: list[TaskSpec] = load_suite(preset.suite, split="train")[: preset.concurrency]

    def params(self) -> list[SamplingParams]:
        from activities.inference import sample_params

        return [
            sample_params(self.sampling, t.id, s, 0) for t in self.tasks for s in range(self.group)
        ]

    def rows(self) -> list[Row]:
        return [(t.id, s) for t in self.tasks for s in range(self.group)]

    def prompts(self, chat: Any) -> list[list[int]]:
        return [chat.first_prompt(t.prompt) for t in self.tasks for _ in range(self.group)]

    def requests(self, run_id: str) -> list[GenerateRequest]:
        return [
            GenerateRequest(
                run_id=run_id,
                task_id=task.id,
                turn=0,
                env=EnvName.CODE,
                prompt=task.prompt,
                sampling=self.sampling,
                max_context_tokens=self.max_context,
                policy_run=POLICY_RUN,
                policy_version=0,
                items=[GenerateItem(sample=s) for s in range(self.group)],
            )
            for task in self.tasks
        ]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def figures(tokens: int, seconds: float, at: float) -> dict:
    return {
        "tokens": tokens,
        "s": round(seconds, 2),
        "tok_s": round(tokens / seconds, 1),
        "load": at,
    }


async def bare(
    backend: Any, prompts: list[list[int]], params: list[SamplingParams], policy, rows: list[Row]
) -> tuple[dict, dict[Row, int]]:
    """The rows in one call of `backend`: figures, and each row's count of sampled tokens."""
    started, at = time.perf_counter(), load()
    outputs = await backend.generate(prompts, params, policy)
    seconds = time.perf_counter() - started
    counts = {row: len(o.token_ids) for row, o in zip(rows, outputs, strict=True)}
    return figures(sum(counts.values()), seconds, at), counts


def shown(value: float | None) -> str:
    """A figure of the summary table: one decimal (medians are floats), or `-`."""
    return "-" if value is None else f"{value:.1f}"


DRIFT_TOLERANCE = 0.01
"""Sampled tokens a run may differ from the first by, summed over rows, as a fraction of the
first run's: the batcher composes the pipeline's batches as rows arrive, a static batch's
padding is another shape, and the float sums differ by a rounding, which now and then flips a
token sampled near a boundary (seen: one row of 48, 39 tokens against 41 of 2,267). More than
this is different work."""


def check_same_tokens(seen: dict[Row, int], reference: dict[Row, int]) -> int:
    """Stop the bench unless `seen` sampled the rows of `reference`, each as many tokens but for
    a drift of at most `DRIFT_TOLERANCE` of them in all (the same seeds: more is different work,
    and no ratio between the two is fair). Returns the drift, recorded beside the figures."""
    if seen.keys() != reference.keys():
        raise SystemExit(f"the runs sampled different rows: {sorted(seen)} vs {sorted(reference)}")
    differ = {row: (seen[row], reference[row]) for row in reference if seen[row] != reference[row]}
    drift = sum(abs(a - b) for a, b in differ.values())
    if drift > DRIFT_TOLERANCE * sum(reference.values()):
        shown = ", ".join(f"{row}: {a} vs {b}" for row, (a, b) in list(differ.items())[:8])
        raise SystemExit(
            f"{len(differ)} of {len(reference)} rows sampled another number of tokens than the "
            f"first run (seen vs first), {drift} tokens in all, over {DRIFT_TOLERANCE:.0%} of "
            f"{sum(reference.values())}: {shown}"
        )
    return drift


def paired_summary(pairs: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Each vLLM variant's median tok/s beside the median of the transformers runs paired with
    it (measured in turns with it, under the same load), and their ratio."""
    summary = {}
    for name, runs in pairs.items():
        tok_s = median_of([r["tok_s"] for r in runs[name]])
        local = median_of([r["tok_s"] for r in runs["local"]])
        summary[name] = {
            "tok_s": tok_s,
            "local_tok_s": local,
            "vs_local": round(tok_s / local, 3),
            "runs": runs[name],
            "local_runs": runs["local"],
        }
    return summary


def engine_backend(name: str, model: Path) -> Any:
    """`local`, or a started vLLM engine: `vllm` (the settings' defaults: eager, LoRA served),
    `vllm-nolora` (eager, no LoRA layers), `vllm-compiled` (torch.compile, LoRA served)."""
    if name == "local":
        from infra.inference.local import LocalBackend

        return LocalBackend()
    from infra.inference.vllm import VLLMBackend

    config = VLLMSettings(enforce_eager=name != "vllm-compiled", enable_lora=name != "vllm-nolora")
    backend = VLLMBackend(config)
    started = time.perf_counter()
    backend.start(model)
    print(f"  {name}: engine up and warm in {time.perf_counter() - started:.0f} s", flush=True)
    return backend


async def engine_vs_engine(engines: list[str], model: Path, shape: Shape, reps: int) -> dict:
    """transformers and each vLLM variant bare on the same rows, in turns (one vLLM engine at a
    time: each holds gigabytes); transformers is measured beside every variant."""
    from transformers import AutoTokenizer

    from infra.inference.prompts import ChatFormat

    prompts = shape.prompts(ChatFormat(AutoTokenizer.from_pretrained(str(model)), EnvName.CODE))
    params, policy, rows = shape.params(), PolicyHandle(POLICY_RUN, 0, model), shape.rows()
    local = engine_backend("local", model)
    await local.generate(prompts[:8], params[:8], policy)  # warm-up
    alone: list[dict] = []  # `--engines local`: no variant to pair with
    pairs: dict[str, dict[str, list[dict]]] = {}
    for name in (e for e in engines if e != "local"):
        backend = engine_backend(name, model)
        pairs[name] = {"local": [], name: []}
        try:
            await backend.generate(prompts[:8], params[:8], policy)  # the first batches are slow
            for rep in range(reps):
                pair = [("local", local), (name, backend)]
                for label, engine in pair if rep % 2 == 0 else pair[::-1]:
                    with idle_side(f"bare {label} beside {name} [{rep}]"):
                        row, _ = await bare(engine, prompts, params, policy, rows)
                    pairs[name][label].append(row)
                    print(f"  bare [{rep}] {label:14s} {row}", flush=True)
        finally:
            await backend.close()
    if not pairs:
        for rep in range(reps):
            with idle_side(f"bare local [{rep}]"):
                row, _ = await bare(local, prompts, params, policy, rows)
            alone.append(row)
            print(f"  bare [{rep}] local          {row}", flush=True)
    await local.close()
    every_local = alone + [r for runs in pairs.values() for r in runs["local"]]
    return {
        "local": {"tok_s": median_of([r["tok_s"] for r in every_local]), "runs": every_local},
        **paired_summary(pairs),
    }


async def pipeline(engine: str, model: Path, shape: Shape, reps: int) -> dict:
    """The production inference worker of `engine` through Temporal vs its backend bare."""
    overrides = {
        "inference": InferenceSettings(
            backend="vllm" if engine.startswith("vllm") else "local",
            base_model=str(model),
            vllm=VLLMSettings(
                enforce_eager=engine != "vllm-compiled", enable_lora=engine != "vllm-nolora"
            ),
        )
    }
    with tempfile.TemporaryDirectory() as home, bench_stack(Path(home), **overrides) as settings:
        async with production_workers(settings, [Queue.INFERENCE]) as (client, plans):
            generate = plans[Queue.INFERENCE].activities[0]
            activities = generate.__self__  # the worker's InferenceActivities
            policy = await activities.policies.resolve(POLICY_RUN)  # the bootstrap publishes v0
            chat = await activities.chat_format(policy, EnvName.CODE)
            prompts, params = shape.prompts(chat), shape.params()
            worker = Worker(client, task_queue=BENCH_QUEUE, workflows=[BenchGenerate])
            async with worker:
                await through_temporal(client, shape.requests(f"warm-{uuid.uuid4().hex[:6]}")[:2])
                rows: dict[str, list[dict]] = {"pipeline": [], "bare": []}
                first: dict[Row, int] | None = None  # the first run's tokens per row
                for rep in range(reps):
                    for mode in ("pipeline", "bare") if rep % 2 == 0 else ("bare", "pipeline"):
                        with idle_side(f"{engine} {mode} [{rep}]"):
                            if mode == "bare":
                                backend = activities.backend
                                row, counts = await bare(
                                    backend, prompts, params, policy, shape.rows()
                                )
                            else:
                                run_id = f"bench-{rep}-{uuid.uuid4().hex[:6]}"
                                row, counts = await through_temporal(client, shape.requests(run_id))
                        first = first or counts
                        row["drift"] = check_same_tokens(counts, first)
                        rows[mode].append(row)
                        print(f"  {engine} [{rep}] {mode:8s} {row}", flush=True)
    pipe, alone = (median_of([r["tok_s"] for r in rows[m]]) for m in ("pipeline", "bare"))
    return {"ratio": round(pipe / alone, 3), "target": 0.8, **rows}


async def through_temporal(
    client: Any, requests: list[GenerateRequest]
) -> tuple[dict, dict[Row, int]]:
    """The requests through Temporal at once: figures, and each row's count of sampled tokens."""
    started, at = time.perf_counter(), load()
    responses = await asyncio.gather(
        *(
            client.execute_workflow(
                BenchGenerate.run, r, id=f"{r.run_id}-{r.task_id}", task_queue=BENCH_QUEUE
            )
            for r in requests
        )
    )
    seconds = time.perf_counter() - started
    counts = {
        (request.task_id, c.sample): c.num_tokens
        for request, response in zip(requests, responses, strict=True)
        for c in response.completions
    }
    return figures(sum(counts.values()), seconds, at), counts


async def main(args: argparse.Namespace) -> None:
    from infra.base_models import materialize_base_model

    model = materialize_base_model("smollm2", Settings(home=ROOT / ".tempered"))
    shape = Shape()
    engines = args.engines.split(",")
    print(f"{len(shape.tasks)} tasks x {shape.group} samples, {shape.sampling}", flush=True)
    report: dict[str, Any] = {"rows": len(shape.tasks) * shape.group, "machine": machine()}
    if args.bare:
        report["bare"] = await engine_vs_engine(engines, model, shape, args.reps)
    if args.pipeline:
        chosen = args.pipeline_engines.split(",")
        report["pipeline"] = {e: await pipeline(e, model, shape, args.reps) for e in chosen}
    report["machine_after"] = machine()
    print("engine          bare tok/s   paired local tok/s   pipeline/bare")
    for name in engines:
        bare_row = report.get("bare", {}).get(name, {})
        paired = bare_row.get("local_tok_s")
        ratio = report.get("pipeline", {}).get(name, {}).get("ratio")
        print(f"{name:14s} {shown(bare_row.get('tok_s')):>10}   {shown(paired):>18}   {ratio}")
    # a --no-bare or --no-pipeline run keeps the other part of an earlier run's figures, named
    # as such: the entry's `measured_at` is this run's
    earlier = json.loads(RESULTS.read_text()).get("engines", {}) if RESULTS.exists() else {}
    kept = [part for part in ("bare", "pipeline") if part in earlier and part not in report]
    merge_results("engines", {**earlier, **report, "kept_from_earlier": kept})


if __name__ == "__main__":  # vLLM starts its engine processes with spawn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engines", default="local,vllm", help="local, vllm, vllm-nolora, vllm-compiled"
    )
    parser.add_argument("--reps", type=int, default=2, help="measured rounds per engine")
    parser.add_argument("--no-bare", dest="bare", action="store_false", help="pipeline only")
    parser.add_argument("--no-pipeline", dest="pipeline", action="store_false")
    parser.add_argument("--pipeline-engines", default="local,vllm", help="engines run in it")
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    asyncio.run(main(args))
