"""Two of the `vllm` backend's failures, on a fake `AsyncLLM` (no engine starts):

- An engine core that dies while it reloads a version's weights (OOM-killed, a segfault:
  `EngineDeadError`) is no failure of the version: it was counted, so two deaths
  `LOAD_RETRY_S` apart made a version whose weights were fine final, failing its run for good.
  Now it is the plain retryable "the vLLM engine died", never counted.
- A sampled row of temperature 0 < T < 0.01 is refused (by generate, and by `tempered train`
  before a run starts): vLLM samples and scores it at 0.01 while the row records T, at which
  the learner recomputes its log-probs (a wrong importance ratio).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.run import TrainingRunInput
from contracts.task import SamplingParams
from infra.inference import InferenceError, PolicyHandle
from infra.inference.gate import VersionGate
from infra.inference.vllm import VLLMBackend
from infra.inference.vllm_rows import refusal
from infra.settings import InferenceSettings, Settings, VLLMSettings
from tests.infra.inference.test_vllm_review import (  # noqa: F401 (a fixture)
    Builds,
    Engine,
    builds,
    versions,
)


@pytest.mark.asyncio
@pytest.mark.parametrize("errored", [True, False])
async def test_an_engine_dying_during_a_reload_is_retried_never_counted(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
    errored: bool,
) -> None:
    """`errored`: whether the engine says so by the time the reload's error arrives (it may
    not yet: the error alone tells)."""
    pytest.importorskip("vllm")
    from vllm.v1.engine.exceptions import EngineDeadError

    class DyingEngine(Engine):
        """Its engine core dies in a reload while `deaths` are left (the next engine's too)."""

        deaths = 0

        async def collective_rpc(self, method: str, kwargs: dict[str, str]) -> None:
            if DyingEngine.deaths > 0:
                DyingEngine.deaths -= 1
                self.errored = errored
                raise EngineDeadError()
            await super().collective_rpc(method, kwargs)

    builds.make = lambda args, broken: DyingEngine(Path(args.model), broken=broken)
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)  # every counted failure counts
    gate = VersionGate(backend._load, wait_s=5.0)

    async def serve(policy: PolicyHandle) -> None:
        async with gate.serving(policy):
            pass

    await serve(version(0))
    DyingEngine.deaths = 3  # the engine core dies mid-RPC, in each retry's engine too
    for attempt in range(3):
        with pytest.raises(InferenceError, match="the vLLM engine died") as died:
            await serve(version(1))
        assert died.value.retryable, attempt  # v1's weights are fine
        assert "failed to load" not in str(died.value)
        assert ("shutdown", None) in builds[-1].calls and backend._engine is None
    assert len(builds) == 3  # each retry rebuilt the engine (on v0, its home)
    assert not backend._load_failures
    await serve(version(1))  # the next engine loads it
    assert builds[-1].calls[-1] == ("version", "run/v1")


@pytest.mark.asyncio
async def test_a_temperature_vllm_would_raise_is_refused_on_generate_and_by_train() -> None:
    from workers.cli.train_inputs import backend_problem

    cold = SamplingParams(temperature=0.005, top_p=1.0)
    field, message = refusal(cold) or ("", "")
    assert field == "temperature = 0.005" and "0.01" in message
    for served in (0.0, 0.01, 0.7):
        assert refusal(SamplingParams(temperature=served, top_p=1.0)) is None
    backend = VLLMBackend(VLLMSettings())  # never started: the refusal needs no engine
    with pytest.raises(InferenceError, match="temperature = 0.005") as refused:
        await backend.generate([[1]], [cold], PolicyHandle("run", 0, Path("/nonexistent")))
    assert not refused.value.retryable
    settings = Settings(inference=InferenceSettings(backend="vllm"))
    run = TrainingRunInput.model_validate({"run_id": "r", "suite": "starter", "sampling": cold})
    assert backend_problem(settings, run) == f"sampling.{field}: {message}"
