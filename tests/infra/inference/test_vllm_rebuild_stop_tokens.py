"""A version whose end-of-sequence tokens differ from those the `vllm` engine was built with
restarts the engine on it rather than reloading its weights: vLLM reads the tokenizer's eos and
generation_config.json's `eos_token_id` once, at build, so a reloaded version stopped on the old
checkpoint's tokens (the local backend reads them per version). On a fake `AsyncLLM`
(test_vllm_review.py's `builds`); the files are the checkpoint's only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.inference import PolicyHandle
from infra.inference.gate import VersionGate
from infra.inference.vllm import VLLMBackend
from infra.inference.vllm_engine import architecture
from infra.settings import VLLMSettings
from tests.infra.inference.test_vllm_review import Builds, builds  # noqa: F401 (a fixture)

CONFIG = {"hidden_size": 64, "vocab_size": 50, "eos_token_id": 2}


def checkpoint(root: Path, n: int, generation: dict[str, Any], eos_token: str) -> PolicyHandle:
    """Version `n`: one config.json for all, its generation_config.json and tokenizer's eos."""
    path = root / f"v{n}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**CONFIG, "_name_or_path": str(path)}))
    (path / "generation_config.json").write_text(json.dumps(generation))
    tokenizer = {"eos_token": eos_token, "model_max_length": 2048}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return PolicyHandle("run", n, path)


@pytest.mark.asyncio
async def test_a_version_with_other_end_tokens_restarts_the_engine_on_it(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    v0 = checkpoint(tmp_path, 0, {"eos_token_id": 2, "transformers_version": "4.5"}, "</s>")
    v1 = checkpoint(tmp_path, 1, {"eos_token_id": 2, "transformers_version": "4.6"}, "</s>")
    v2 = checkpoint(tmp_path, 2, {"eos_token_id": [2, 7]}, "</s>")  # generation_config's
    v3 = checkpoint(tmp_path, 3, {"eos_token_id": [2, 7]}, "<|im_end|>")  # the tokenizer's
    assert architecture(v0.path) == architecture(v1.path)  # the version label differs only
    assert len({json.dumps(architecture(v.path)) for v in (v1, v2, v3)}) == 3

    backend = VLLMBackend(VLLMSettings())
    gate = VersionGate(backend._load, wait_s=5.0)
    for version in (v0, v1, v2, v3):
        async with gate.serving(version):
            pass
    assert [e.model for e in builds] == [v0.path, v2.path, v3.path]
    assert ("reload_weights", v1.path) in builds[0].calls  # v1 stops where v0 does
