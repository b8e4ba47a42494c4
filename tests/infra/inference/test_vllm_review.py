"""The `vllm` backend's failures, on a fake `AsyncLLM` (no engine starts): which are final and
which are retried.

- A sampled row with top-p < 1 is refused on generate, for good, whichever way its run started
  (`tempered train --no-workers` against vLLM workers, or `temporal workflow start`): served, its
  log-probs were up to -log(top_p) above the learner's, with one warning in the worker's log.
- A dead engine's rebuild that fails (e.g. memory not back yet) is retried: it was final, so
  the run failed for good (never counted against the version: test_vllm_rebuild_attribution.py).
- A failed `reload_weights` shuts the engine down (vLLM's reload state is left half-built: every
  later reload failed, with the engine not `errored`) and is retried; a version that fails to
  load twice in a row, `LOAD_RETRY_S` apart at least, is final (it was a bare Exception,
  retried for ever); two requests failing in one incident count once.
- vLLM 0.32 rejects a request with `VLLMValidationError`, which is no `ValueError`: a rejected
  request was retried for ever. (An evicted LoRA directory never reaches vLLM as a request: it
  killed the engine; its test: test_vllm62_lora.py.)
- A sampled token vLLM gave no log-prob for is a retried error, not a NaN stored with the row.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.run import TrainingRunInput
from contracts.task import SamplingParams
from infra.inference import GenerationOutput, InferenceError, PolicyHandle, vllm_engine
from infra.inference.gate import VersionGate
from infra.inference.vllm import TOP_P_REFUSAL, VLLMBackend
from infra.settings import InferenceSettings, Settings, VLLMSettings

BROKEN_RELOAD = "Call to collective_rpc method failed: Worker failed with error ''Parameter'"


class Engine:
    """What `_load` asks of an `AsyncLLM`; `reload` raises what it is given, as does a reload of
    a directory in `broken` (weights that do not load)."""

    errored = False
    resets = True  # vLLM's answer: False while KV blocks are still in use

    def __init__(
        self,
        model: Path,
        reload: Exception | None = None,
        broken: dict[Path, Exception] | None = None,
    ) -> None:
        self.model, self.reload, self.calls = model, reload, list[tuple[str, object]]()
        self.broken = broken if broken is not None else {}

    async def collective_rpc(self, method: str, kwargs: dict[str, str]) -> None:
        path = Path(kwargs["weights_path"])
        self.calls.append((method, path))
        if self.reload is not None:
            raise self.reload
        if path in self.broken:
            raise self.broken[path]

    async def reset_prefix_cache(self) -> bool:
        return self.resets

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("version", version))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


class Builds(list[Any]):
    """The engines built, in order; `broken`: directories whose weights fail to load (their
    build raises, as vLLM's engine core does, and so does a reload of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: dict[Path, Exception] = {}
        self.make: Callable[[SimpleNamespace, dict[Path, Exception]], Engine] = (
            lambda args, broken: Engine(Path(args.model), broken=broken)
        )  # what a build makes (another fake engine: test_vllm62_lora.py)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Builds:
    """Each engine build's engine, or the exception it raises: append one to make the next
    build fail (a `from_engine_args` that raises, as vLLM's does when the core dies)."""
    made = Builds()

    def from_engine_args(args: SimpleNamespace) -> Engine:
        if made and isinstance(made[-1], Exception):
            raise made.pop()
        if Path(args.model) in made.broken:
            raise RuntimeError("Engine core initialization failed. See root cause above.")
        made.append(made.make(args, made.broken))
        return made[-1]

    async_llm = SimpleNamespace(AsyncLLM=SimpleNamespace(from_engine_args=from_engine_args))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.async_llm", async_llm)
    monkeypatch.setitem(
        sys.modules, "vllm.engine.arg_utils", SimpleNamespace(AsyncEngineArgs=SimpleNamespace)
    )
    monkeypatch.setattr(vllm_engine, "configure_processes", lambda config: None)  # os.environ
    return made


def versions(tmp_path: Path) -> Callable[[int], PolicyHandle]:
    def version(n: int) -> PolicyHandle:
        path = tmp_path / f"v{n}"
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 50}))
        return PolicyHandle("run", n, path)

    return version


@pytest.mark.asyncio
async def test_a_sampled_top_p_row_is_refused_on_generate_for_good() -> None:
    """The backend is the one place that sees every run's rows (`tempered train` checks only
    where the workers run here)."""
    backend = VLLMBackend(VLLMSettings())  # never started: the refusal needs no engine
    handle = PolicyHandle("run", 0, Path("/nonexistent"))
    nucleus = SamplingParams(temperature=0.9, top_p=0.95)
    for _ in range(2):  # every time, not once
        with pytest.raises(InferenceError) as refused:
            await backend.generate([[1], [2]], [SamplingParams(top_p=1.0), nucleus], handle)
        assert not refused.value.retryable
        assert TOP_P_REFUSAL.format(top_p=0.95) in str(refused.value)
    greedy = SamplingParams(temperature=0.0, top_p=0.95)  # samples no nucleus: served
    with pytest.raises(InferenceError, match="the engine is not started"):
        await backend.generate([[1]], [greedy], handle)


def test_train_refuses_what_the_backend_refuses_in_its_words() -> None:
    from infra.inference.vllm_rows import refusal
    from workers.cli.train_inputs import backend_problem

    settings = Settings(inference=InferenceSettings(backend="vllm"))
    nucleus = SamplingParams(temperature=0.9, top_p=0.95)
    run = TrainingRunInput.model_validate(
        {"run_id": "r", "suite": "starter", "sampling": {"top_p": 1.0}, "eval_sampling": nucleus}
    )
    field, message = refusal(nucleus) or ("", "")
    assert backend_problem(settings, run) == f"eval_sampling.{field}: {message}"
    assert refusal(SamplingParams(temperature=0.0, top_p=0.95)) is None


@pytest.mark.asyncio
async def test_a_dead_engine_whose_rebuild_fails_is_retried_a_start_that_fails_is_final(
    tmp_path: Path, builds: Builds
) -> None:
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings())
    backend._engine = Engine(tmp_path, reload=None)
    backend._engine.errored = True  # died serving
    backend._arch = {"hidden_size": 64, "vocab_size": 50}
    builds.append(RuntimeError("Engine core initialization failed. See root cause above."))
    with pytest.raises(InferenceError, match="Engine core initialization failed") as failed:
        await backend._load(version(3))
    assert failed.value.retryable  # memory may be back at the retry
    await backend._load(version(3))  # and it is
    assert [e.model for e in builds] == [version(3).path]

    builds.append(RuntimeError("Engine core initialization failed. See root cause above."))
    with pytest.raises(InferenceError, match="the engine did not start") as start:
        VLLMBackend(VLLMSettings()).start(version(0).path)
    assert not start.value.retryable  # at worker start: one clear error, the worker stops


@pytest.mark.asyncio
async def test_a_failed_reload_restarts_the_engine_and_a_version_failing_twice_is_final(
    tmp_path: Path, builds: Builds
) -> None:
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)  # every failure counts
    gate = VersionGate(backend._load, wait_s=5.0)

    async def serve(policy: PolicyHandle) -> None:
        async with gate.serving(policy):
            pass

    await serve(version(0))  # built on v0
    first = builds[0]
    first.reload = Exception(BROKEN_RELOAD)  # vLLM's collective_rpc raises a bare Exception
    with pytest.raises(InferenceError, match="run/v1") as failed:
        await serve(version(1))
    assert failed.value.retryable and "\n" not in str(failed.value)
    assert ("shutdown", None) in first.calls and backend._engine is None  # half-built: gone
    await serve(version(1))  # the retry rebuilds the engine on v0 (its home), loads v1
    assert [e.model for e in builds] == [version(0).path, version(0).path]
    assert builds[-1].calls[-2:] == [("reload_weights", version(1).path), ("version", "run/v1")]
    assert "run/v1" not in backend._load_failures  # cleared: "in a row" starts again

    builds.broken[version(2).path] = RuntimeError("safetensors: invalid header")
    with pytest.raises(InferenceError, match="run/v2") as once:
        await serve(version(2))
    assert once.value.retryable
    with pytest.raises(InferenceError, match="run/v2.*failed to load 2 times") as twice:
        await serve(version(2))  # and into the engine rebuilt for it
    assert not twice.value.retryable and "\n" not in str(twice.value)
    await serve(version(3))  # counted per version: another loads
    assert builds[-1].calls[-1] == ("version", "run/v3")


@pytest.mark.asyncio
async def test_two_waiters_failing_in_one_incident_are_retried(
    tmp_path: Path, builds: Builds
) -> None:
    """Two generates of v1 wait at the gate; v1's reload fails, and the next waiter's, at once,
    into the engine rebuilt for it, fails too: one incident, not two failures in a row (it
    failed that generate, its task and its run for good). A failure `LOAD_RETRY_S` later counts
    again. (An engine that does not start is never counted: test_vllm_rebuild_attribution.py.)"""
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.3)
    gate = VersionGate(backend._load, wait_s=5.0)

    async def serve(policy: PolicyHandle) -> None:
        async with gate.serving(policy):
            pass

    await serve(version(0))
    builds.broken[version(1).path] = Exception(BROKEN_RELOAD)
    both = await asyncio.gather(serve(version(1)), serve(version(1)), return_exceptions=True)
    assert all(isinstance(r, InferenceError) and r.retryable for r in both), both
    assert len(builds) == 2  # the second waiter's rebuild
    await asyncio.sleep(0.35)
    with pytest.raises(InferenceError, match="run/v1") as again:
        await serve(version(1))
    assert not again.value.retryable  # the second counted failure, 0.3 s after the first


@pytest.mark.asyncio
async def test_an_evicted_config_and_an_unreset_prefix_cache_are_not_counted(
    tmp_path: Path, builds: Builds
) -> None:
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)
    await backend._load(version(0))
    gone = PolicyHandle("run", 1, tmp_path / "evicted")
    for _ in range(3):
        with pytest.raises(InferenceError, match="no checkpoint config") as evicted:
            await backend._load(gone)
        assert evicted.value.retryable
    builds[0].resets = False
    for _ in range(3):
        with pytest.raises(InferenceError, match="kept its prefix cache") as kept:
            await backend._load(version(2))
        assert kept.value.retryable
    assert not backend._load_failures


def test_a_request_vllm_rejects_is_final() -> None:
    pytest.importorskip("vllm")
    from vllm.exceptions import VLLMValidationError

    from infra.inference.vllm_rows import engine_error

    alive = SimpleNamespace(errored=False)
    too_long = VLLMValidationError("prompt too long\nfor the model", parameter="prompt")
    rejected = engine_error(too_long, alive)
    assert not rejected.retryable
    assert str(rejected) == "vLLM rejected the request: VLLMValidationError: prompt too long"
    assert engine_error(ValueError("older builds' rejection"), alive).retryable is False


def test_a_token_without_its_log_prob_is_retried_a_computed_nan_passed_on() -> None:
    from infra.inference.vllm_rows import append

    def completion(tokens: list[int], logprobs: Any) -> Any:
        return SimpleNamespace(token_ids=tokens, logprobs=logprobs)

    step = SimpleNamespace
    output = GenerationOutput([], [], "length")
    assert not append(output, completion([4], [{4: step(logprob=float("nan"))}]), None)
    assert output.token_ids == [4] and math.isnan(output.logprobs[0])  # passed on
    for missing in (completion([5, 6], None), completion([5, 6], [{5: step(logprob=-1.0)}, {}])):
        with pytest.raises(InferenceError, match="no log-prob for sampled token") as raised:
            append(GenerationOutput([], [], "length"), missing, None)
        assert raised.value.retryable
