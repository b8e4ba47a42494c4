"""The `vllm` backend's start-up errors: one line saying what is wrong, at worker start.

Runs without vLLM installed (the missing-engine case is what it checks); the case of an engine
that starts but cannot serve the model needs vLLM and minutes, so it is marked slow.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from contracts.task import SamplingParams
from infra.base_models import materialize_base_model
from infra.inference import InferenceError, PolicyHandle, get_backend
from infra.inference.vllm import VLLMBackend
from infra.settings import Settings, VLLMSettings


def test_a_missing_engine_is_one_line_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # as if vllm were not installed, also where an earlier test imported its submodules
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")] or ["vllm"]:
        monkeypatch.setitem(sys.modules, name, None)
    backend = VLLMBackend(VLLMSettings())
    with pytest.raises(InferenceError) as err:
        backend.start(tmp_path)
    message = str(err.value)
    assert message.startswith("vllm backend: vLLM is not installed") and "\n" not in message
    assert "make setup" in message and not err.value.retryable


@pytest.mark.asyncio
async def test_a_backend_that_was_not_started_says_so(tmp_path: Path) -> None:
    backend = get_backend(Settings(home=tmp_path, inference={"backend": "vllm"}), start=False)
    assert isinstance(backend, VLLMBackend)
    with pytest.raises(InferenceError, match="the engine is not started"):
        await backend.generate([[1]], [SamplingParams(top_p=1)], PolicyHandle("r", 0, tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(find_spec("vllm") is None, reason="vLLM is not installed")
def test_an_engine_that_cannot_serve_the_model_fails_its_warm_up_in_one_line(
    tmp_path: Path,
) -> None:
    tiny = materialize_base_model("tiny", Settings(home=tmp_path))  # head size 16: unsupported
    backend = VLLMBackend(VLLMSettings(kv_cache_gib=0.25, max_num_seqs=4, max_model_len=256))
    with pytest.raises(InferenceError, match=r"^vllm backend: the engine on .* failed its warm"):
        backend.start(tiny)
