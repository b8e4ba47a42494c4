"""The generate activity under concurrent work, on a real SeaweedFS and the real local backend held
at a gate: a first wave that loads the tokenizer once, a hot reload that finishes in-flight work
on the old version, an overlapping attempt that stored first, the chat-format cache, heartbeats
while a request waits, and cancelled requests, or the other rows of a failed attempt, leaving the
backend unsampled.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.inference import InferenceActivities
from contracts.rollout import CompletionRecord
from contracts.task import EnvName, SamplingParams
from infra import keys
from infra.inference import GenerationOutput, InferenceError, PolicyHandle
from infra.policy import publish_policy
from infra.storage import ObjectStore
from tests.activities.generation import PROMPT, RUN, GatedBackend, chat, generate, request
from tests.activities.heartbeats import timing_out_after
from tests.infra.inference.policies import loaded_versions


@pytest.mark.asyncio
async def test_a_wave_of_activities_loads_the_tokenizer_once(
    acts: InferenceActivities, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's first wave asks for the chat format from 64 activities at once; a fresh run's
    first decode waited 40 s while each of them loaded the tokenizer."""
    from transformers import AutoTokenizer

    loads: list[str] = []
    original = AutoTokenizer.from_pretrained

    def counted(path: str) -> object:
        loads.append(path)
        return original(path)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counted)
    formats = await asyncio.gather(*(chat(acts) for _ in range(16)))
    assert len(loads) == 1 and len({id(f) for f in formats}) == 1


@pytest.mark.asyncio
async def test_hot_reload_finishes_in_flight_work_on_the_old_version(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path
) -> None:
    acts.policies.latest_ttl_s = 0.0  # every request re-reads latest.json
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    backend.gate.clear()
    in_flight = asyncio.create_task(generate(acts, request("old", samples=2)))
    while backend.held < 2:  # its rows are in the backend, on v0, held at the gate
        await asyncio.sleep(0.01)
    await asyncio.to_thread(publish_policy, store, RUN, 1, tiny_dir, 1)
    newer = asyncio.create_task(generate(acts, request("new", samples=2)))
    while backend.held < 4:  # resolved to v1, in the backend beside the old rows
        await asyncio.sleep(0.01)
    backend.gate.set()
    old, new = await asyncio.gather(in_flight, newer)
    assert old.policy_version == 0 and new.policy_version == 1
    for response, version in ((old, 0), (new, 1)):
        for c in response.completions:
            assert store.get_model(c.completion.key, CompletionRecord).policy_version == version
    pinned = await generate(acts, request("pinned", samples=1, policy_version=0))
    assert pinned.policy_version == 0
    assert sorted(loaded_versions(backend)) == [(RUN, 0), (RUN, 1)]


@pytest.mark.asyncio
async def test_an_attempt_that_stored_first_wins_an_overlapping_one(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    """Two attempts of one step overlap: the other stores its record while this one samples.
    This one returns the other's record and the code in it, never a ref to overwritten bytes."""
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    backend.gate.clear()
    this = asyncio.create_task(generate(acts, request("overlap", samples=1)))
    while backend.held == 0:
        await asyncio.sleep(0.01)
    prompt = (await chat(acts)).first_prompt(PROMPT)
    theirs = CompletionRecord(
        text="```python\ndef add(a, b):\n    return b + a\n```",
        prompt_token_ids=prompt,
        completion_token_ids=[5, 6],
        logprobs=[-0.5, -0.5],
        policy_version=0,
    )
    key = keys.turn_key(RUN, "overlap", 0, 0, "completion.json")
    stored = store.put_json(key, theirs, create_only=True)
    backend.gate.set()
    (completion,) = (await this).completions
    assert completion.completion == stored and store.head(key) == stored
    assert completion.code is not None
    assert store.get_text(completion.code.key) == "def add(a, b):\n    return b + a\n"


@pytest.mark.asyncio
async def test_chat_formats_of_the_four_latest_policies_are_kept_one_tokenizer_each(
    acts: InferenceActivities, tiny_dir: Path, tmp_path: Path
) -> None:
    def policy(version: int, template: bool = True) -> PolicyHandle:
        path = tmp_path / "copies" / f"v{version}"
        shutil.copytree(tiny_dir, path, ignore=shutil.ignore_patterns("*.safetensors*"))
        if not template:
            (path / "chat_template.jinja").unlink()
        return PolicyHandle(RUN, version, path)

    handles = [policy(version) for version in range(3)]
    asked = [(handle, env) for handle in handles for env in (EnvName.CODE, EnvName.WORKSPACE)]
    formats = [await acts.chat_format(handle, env) for handle, env in asked]
    assert formats[0].tokenizer is formats[1].tokenizer  # a policy's envs share its tokenizer
    assert formats[1].tokenizer is not formats[2].tokenizer
    assert list(acts._formats) == [(handle.path, env) for handle, env in asked[2:]]
    assert await acts.chat_format(*asked[2]) is formats[2]  # kept, and now the latest
    assert list(acts._formats)[-1] == (asked[2][0].path, EnvName.CODE)
    with pytest.raises(InferenceError, match="no chat template") as refused:
        await acts.chat_format(policy(9, template=False), EnvName.CODE)
    assert not refused.value.retryable  # a policy that cannot be prompted is not retried


@pytest.mark.asyncio
async def test_heartbeats_flow_while_waiting_and_cancelled_requests_leave_the_queue(
    acts: InferenceActivities,
) -> None:
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    backend.gate.clear()
    beats: list[object] = []
    held_env, doomed_env = timing_out_after(0.15), ActivityEnvironment()
    held_env.on_heartbeat = lambda *details: beats.append(details)
    held = asyncio.create_task(held_env.run(acts.generate, request("held", samples=2)))
    while backend.held < 2:
        await asyncio.sleep(0.01)
    doomed = asyncio.create_task(doomed_env.run(acts.generate, request("doomed", samples=3)))
    while backend.held < 5:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert len(beats) >= 3  # the event loop stays free while the rows are held
    doomed_env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert backend.held == 2  # the cancelled rows left the backend
    backend.gate.set()
    assert len((await held).completions) == 2
    assert backend.rows == 2  # the cancelled samples were never generated


@pytest.mark.asyncio
async def test_a_row_that_fails_ends_its_attempts_other_rows(
    acts: InferenceActivities, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row of an attempt fails: its other rows leave the backend with it (they decoded on
    for nobody, the retry's rows queued behind them)."""
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    backend.gate.clear()
    gated, calls = backend.generate, 0

    async def the_third_fails(
        prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        nonlocal calls
        calls += 1
        if calls < 3:
            return await gated(prompts, params, policy)
        while backend.held < 2:  # the other rows are in the backend
            await asyncio.sleep(0.01)
        raise InferenceError("a transient fault in one row")

    monkeypatch.setattr(backend, "generate", the_third_fails)
    with pytest.raises(ApplicationError, match="a transient fault in one row"):
        await generate(acts, request("fails", samples=3))
    assert backend.held == 0  # the other two left the backend
    backend.gate.set()
    await asyncio.sleep(0.1)
    assert backend.rows == 0
