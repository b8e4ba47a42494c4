"""A rank group that fails ends whole and says so: what a learner of N ranks does when a part of
it dies, hangs or never starts, and what it refuses before it starts.

Three tests form a real group of two ranks (torchrun, gloo on CPU, no model: `set_reference`
needs none): torchrun killed alone takes its ranks with it, a closed group leaves nothing in the
temp dir, and a rank 0 that stops (SIGSTOP, standing in for a hung write or device) fails the
call within its bound, its ranks killed. The others stand torchrun in with a small script
(tests/fixtures/learner_ranks.py, or a fake agent here): a group that dies while it forms, and
ranks in sessions of their own that `_kill` must reach one by one. A sliding-window model with `share_prompt` is refused from its config, before any pass,
so every rank refuses alike.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from contracts.learner import GRPOConfig
from infra import learner_engine, learner_forward
from infra.learner_engine import LearnerEngine
from infra.learner_ranks import RankGroup, RankGroupFailed
from infra.settings import LearnerSettings
from tests.fixtures.learner_ranks import (
    DIES_WHILE_FORMING,
    leftovers,
    stand_in_torchrun,
    still_running,
)
from tests.learner_groups import on_policy_groups

__all__ = ["leftovers", "still_running"]  # the fixture, for the tests below; and for others'

FORMS = LearnerSettings(ranks=2, collective_timeout_s=10, start_timeout_s=240)
"""A real group: time to start on a busy CPU, collectives that give up soon."""
FAKE_AGENT = """
import subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
ranks = [subprocess.Popen(sleep, start_new_session=True) for _ in range(2)]  # as torchrun does
print(*(rank.pid for rank in ranks), flush=True)
time.sleep(120)
"""


def _ranks_of(group: RankGroup, leftovers: list[psutil.Process]) -> list[psutil.Process]:
    ranks = [psutil.Process(pid) for pid in group.pids]
    leftovers.extend(ranks)
    return ranks


def test_ranks_end_with_torchrun(tmp_path: Path, leftovers: list[psutil.Process]) -> None:
    """torchrun starts each rank in a session of its own: each rank asks the kernel for a
    SIGKILL when torchrun dies, else they lived on (on NCCL, holding their GPUs' memory)."""
    group = RankGroup(FORMS, tmp_path / "ranks.log")
    group.set_reference(None)
    ranks = _ranks_of(group, leftovers)
    assert group._process is not None and len(ranks) == 2
    assert all(os.getsid(rank.pid) != os.getsid(group._process.pid) for rank in ranks)
    os.kill(group._process.pid, signal.SIGKILL)  # torchrun alone: an OOM kill, a crash
    assert still_running(ranks) == []
    with pytest.raises(RankGroupFailed, match="learner ranks"):
        group.set_reference(None)
    assert group.pids == [] and group._process is None


def test_a_closed_group_leaves_nothing_in_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leftovers: list[psutil.Process]
) -> None:
    """torchrun's agent made a torchelastic_* directory (its ranks' logs) in the temp dir at
    every start, and nothing removed it, not even a clean close(): a failing learner re-forms
    its group at every attempt."""
    temp = Path(tempfile.mkdtemp(prefix="tt-"))  # short: a Unix socket's path is < 108 bytes
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the worker's own temp files
    monkeypatch.setenv("TMPDIR", str(temp))  # torchrun's and the ranks'
    try:
        group = RankGroup(FORMS, tmp_path / "ranks.log")
        group.set_reference(None)
        _ranks_of(group, leftovers)
        group.close()
        assert sorted(path.name for path in temp.iterdir()) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_a_silent_rank_0_fails_the_call_within_its_bound(
    tmp_path: Path, leftovers: list[psutil.Process]
) -> None:
    """Rank 0 stopped outside a collective: the others wait for its next command without end,
    so only the worker's bound on rank 0's silence (collective_timeout_s + start_timeout_s)
    ends the call, as a retryable failure, the group killed."""
    group = RankGroup(FORMS, tmp_path / "ranks.log")
    group.set_reference(None)
    ranks = _ranks_of(group, leftovers)
    # the bound is read at each call (the worker's alone: the ranks formed with FORMS), so it is
    # shortened once the group has formed, to 1 + 1 s: below what the settings accept, as a wait
    # of the settings' least (10 + 5 s) proves nothing more
    group.settings = FORMS.model_copy(update={"collective_timeout_s": 1.0, "start_timeout_s": 1.0})
    os.kill(ranks[0].pid, signal.SIGSTOP)
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            group.set_reference(None)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(30)
    waited = time.monotonic() - started
    assert outcome, "set_reference still waits on a stopped rank 0 after 30 s"
    assert isinstance(outcome[0], RankGroupFailed)
    assert "rank 0 sent nothing for 2s during set_reference" in str(outcome[0])
    assert 2 <= waited < 17
    assert still_running(ranks) == [] and group.pids == []


def test_a_group_that_dies_while_forming_fails_retryably_and_the_next_call_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = stand_in_torchrun(monkeypatch, tmp_path, DIES_WHILE_FORMING)
    group = RankGroup(LearnerSettings(ranks=2), tmp_path / "ranks.log")
    for attempt in (1, 2):
        with pytest.raises(RankGroupFailed, match="did not start"):
            group.load(tmp_path / "model", 0)
        assert len(started) == attempt  # each call starts a group of its own
        process, private = started[-1]
        assert process.returncode is not None and not private.exists()
        assert group._conn is None and group._process is None and group._dir is None


@pytest.mark.parametrize("torchrun", ["alive", "gone"])
def test_kill_reaches_ranks_in_sessions_of_their_own(
    torchrun: str, tmp_path: Path, leftovers: list[psutil.Process]
) -> None:
    """alive: a group still forming (no pids reported), torchrun's children are found; gone:
    torchrun exited and left its ranks (pids reported), each is killed by its pid."""
    agent = subprocess.Popen(
        [sys.executable, "-c", FAKE_AGENT], stdout=subprocess.PIPE, start_new_session=True
    )
    assert agent.stdout is not None
    ranks = [psutil.Process(int(pid)) for pid in agent.stdout.readline().split()]
    leftovers.extend([psutil.Process(agent.pid), *ranks])
    group = RankGroup(LearnerSettings(ranks=2), tmp_path / "ranks.log")
    group._process = agent
    if torchrun == "gone":
        agent.kill()
        agent.wait()
        group._ranks = ranks
    group._kill()
    assert agent.returncode is not None
    assert still_running(ranks) == []


def test_a_device_index_on_several_ranks_is_refused_in_the_settings() -> None:
    """Rank r takes cuda:r whatever index the setting names: an index is refused where the
    settings are read, not ignored when the group starts."""
    with pytest.raises(ValueError, match="'cuda:2' with ranks = 2.*CUDA_VISIBLE_DEVICES"):
        LearnerSettings(ranks=2, device="cuda:2")
    assert LearnerSettings(ranks=1, device="cuda:2").device == "cuda:2"
    assert LearnerSettings(ranks=2, device="cuda").device == "cuda"


def _sliding_config(**layers: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, **layers,
    )  # fmt: skip


def test_a_sliding_window_model_is_refused_from_its_config() -> None:
    learner_forward.refuse_unshareable(_sliding_config())  # full attention on every layer
    hybrid = _sliding_config(use_sliding_window=True, sliding_window=16, max_window_layers=1)
    assert hybrid.layer_types == ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="set the learner's share_prompt to false"):
        learner_forward.refuse_unshareable(hybrid)


def test_share_prompt_on_a_sliding_window_model_is_refused_before_any_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passes are dealt to ranks in turn: a refusal in a pass with a shared prompt came from
    some ranks while the others waited in the step's collectives (then a retryable failure,
    retried without end). Refused before the first pass, it comes from every rank alike."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    MistralForCausalLM(
        MistralConfig(
            vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=16, pad_token_id=0,
            eos_token_id=2, bos_token_id=1,
        )
    ).save_pretrained(tmp_path)  # fmt: skip
    grpo_config = GRPOConfig(max_staleness=8, share_prompt=True)
    groups = on_policy_groups(tmp_path)
    engine = LearnerEngine("cpu")
    engine.load(tmp_path, 0, grpo_config)
    passes: list[Any] = []
    pass_logprobs = learner_engine.pass_logprobs

    def counted(model: Any, unit: Any) -> Any:
        passes.append(unit)
        return pass_logprobs(model, unit)

    monkeypatch.setattr(learner_engine, "pass_logprobs", counted)
    with pytest.raises(ValueError, match="set the learner's share_prompt to false"):
        engine.train_step(groups, grpo_config)
    assert passes == []
