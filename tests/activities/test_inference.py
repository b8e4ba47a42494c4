"""The generate activity with a real SeaweedFS, real published policies (the tiny preset) and
the real local backend: stored records, token-in/token-out steps for both environments, the
context budget, invalid input, hot reload; and an episode from sampling to the learner's row.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.inference import InferenceActivities, sample_params
from activities.rewards import RewardActivities
from contracts.episode import EpisodeEnd
from contracts.learner import GRPOConfig
from contracts.rollout import (
    CompletionRecord,
    EpisodeState,
    EpisodeStep,
    GenerateItem,
    GenerateRequest,
    GenerateResponse,
    WriteTrajectoriesRequest,
)
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SamplingParams, TaskSpec, WorkspaceSpec
from contracts.trajectory import Trajectory
from infra import grpo, keys
from infra.inference import GenerationOutput, InferenceError, PolicyHandle
from infra.inference.local import LocalBackend
from infra.inference.prompts import ChatFormat, extract_code, feedback_text
from infra.policy import latest_policy, publish_policy
from infra.settings import InferenceSettings, LocalInferenceSettings, Settings
from infra.storage import ObjectStore

RUN = "run-gen"
PROMPT = "Write add(a, b) returning a + b."


class GatedBackend(LocalBackend):
    """The local backend, holding each batch until `gate` opens (to hold a batch in flight).
    Batched by the batcher (not continuously), so requests queue where the tests can see them."""

    continuous_batching = False

    def __init__(self, config: LocalInferenceSettings):
        super().__init__(config)
        self.gate = asyncio.Event()
        self.gate.set()

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        await self.gate.wait()
        return await super().generate(prompts, params, policy)


@pytest_asyncio.fixture
async def acts(
    tmp_path: Path, store: ObjectStore, tiny_dir: Path
) -> AsyncIterator[InferenceActivities]:
    settings = Settings(
        home=tmp_path,
        inference=InferenceSettings(
            max_batch=8, max_wait_ms=20, local=LocalInferenceSettings(threads=1)
        ),
    )
    await asyncio.to_thread(publish_policy, store, RUN, 0, tiny_dir)
    activities = InferenceActivities(
        settings, store=store, backend=GatedBackend(settings.inference.local)
    )
    yield activities
    await activities.close()


def request(task: str, samples: int = 3, turn: int = 0, **overrides: object) -> GenerateRequest:
    fields: dict[str, object] = {
        "run_id": RUN,
        "task_id": task,
        "turn": turn,
        "prompt": PROMPT,
        "sampling": SamplingParams(temperature=1.0, max_new_tokens=12, seed=5),
        "policy_run": RUN,
        "items": [GenerateItem(sample=s) for s in range(samples)],
    }
    fields.update(overrides)
    return GenerateRequest.model_validate(fields)


async def generate(acts: InferenceActivities, req: GenerateRequest) -> GenerateResponse:
    return await ActivityEnvironment().run(acts.generate, req)


async def chat(acts: InferenceActivities, env: EnvName = EnvName.CODE) -> ChatFormat:
    return await acts.chat_format(await acts.policies.resolve(RUN), env)


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
async def test_generate_stores_exact_records_and_code(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    response = await generate(acts, request("add"))
    assert response.policy_version == 0 and response.tokens_per_s > 0
    assert [c.sample for c in response.completions] == [0, 1, 2]
    code_chat = await chat(acts)
    tokenizer = code_chat.tokenizer
    expected_prompt = code_chat.first_prompt(PROMPT)
    records = []
    for c in response.completions:
        assert c.completion.key == keys.turn_key(RUN, "add", c.sample, 0, "completion.json")
        assert c.code.key == keys.turn_key(RUN, "add", c.sample, 0, "code.py")
        record = store.get_model(c.completion.key, CompletionRecord)
        assert record.prompt_token_ids == expected_prompt
        assert len(record.completion_token_ids) == len(record.logprobs) == c.num_tokens
        assert c.prompt_tokens == len(expected_prompt) and c.call is None
        assert record.policy_version == 0 and record.finish_reason == c.finish_reason
        if record.finish_reason == "stop":  # EOS (<|im_end|>, id 2) ends a row early
            assert record.completion_token_ids[-1] == tokenizer.eos_token_id
        else:
            assert c.num_tokens == 12 and tokenizer.eos_token_id not in record.completion_token_ids
        assert record.text == tokenizer.decode(
            record.completion_token_ids, skip_special_tokens=True
        )
        assert c.code is not None and store.get_text(c.code.key) == extract_code(record.text)
        records.append(record)
    assert len({tuple(r.completion_token_ids) for r in records}) == 3  # a seed per sample
    again = await generate(acts, request("add-again"))  # same seeds, same tokens
    for c, record in zip(again.completions, records, strict=True):
        resampled = store.get_model(c.completion.key, CompletionRecord)
        assert resampled.completion_token_ids == record.completion_token_ids


@pytest.mark.asyncio
async def test_a_run_with_no_published_version_starts_on_the_base_model(
    tmp_path: Path, store: ObjectStore
) -> None:
    """A task started by hand, with no training run to publish its version 0: the first
    GENERATE publishes `inference.base_model` as that version and samples from it."""
    inference = InferenceSettings(base_model="tiny", local=LocalInferenceSettings(threads=1))
    acts = InferenceActivities(Settings(home=tmp_path, inference=inference), store=store)
    by_hand = request("t", samples=1, run_id="by-hand", policy_run="by-hand")
    try:
        response = await generate(acts, by_hand)
    finally:
        await acts.close()
    assert response.policy_version == 0 and len(response.completions) == 1
    published = latest_policy(store, "by-hand")
    assert published is not None and published.version == 0


@pytest.mark.asyncio
async def test_a_retry_reuses_what_an_earlier_attempt_stored(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path
) -> None:
    unseeded = SamplingParams(temperature=1.0, max_new_tokens=6)
    partial = await generate(acts, request("retry", samples=1, sampling=unseeded))
    rows_before = acts.batcher.rows
    # v1 appears; the retry covers samples 0 and 1: sample 0 is reused as stored, sample 1 is
    # sampled from v0 too, so one turn never mixes versions.
    await asyncio.to_thread(publish_policy, store, RUN, 1, tiny_dir, 1)
    acts.policies.latest_ttl_s = 0.0
    retry = await generate(acts, request("retry", samples=2, sampling=unseeded))
    assert retry.policy_version == 0
    assert retry.completions[0] == partial.completions[0]  # same refs, same bytes
    assert acts.batcher.rows == rows_before + 1
    record = store.get_model(retry.completions[1].completion.key, CompletionRecord)
    assert record.policy_version == 0
    with pytest.raises(ApplicationError, match="policy_version") as pinned:
        await generate(acts, request("retry", samples=2, policy_version=1))
    assert pinned.value.non_retryable
    with pytest.raises(ApplicationError, match="another prompt") as changed:
        await generate(acts, request("retry", samples=1, prompt="Write sub(a, b)."))
    assert changed.value.non_retryable


def test_seed_of_each_sample_and_turn() -> None:
    base = SamplingParams(seed=5)
    assert sample_params(base, 2, 1).seed == 2006
    assert sample_params(SamplingParams(seed=None), 2, 1).seed is None


@pytest.mark.asyncio
async def test_next_step_is_the_previous_ids_plus_the_observation(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    first = (await generate(acts, request("fix", samples=1))).completions[0]
    result = ExecutionResult(
        status=ExecStatus.FAILED, tests_passed=0, tests_total=2, stderr="NameError: name 'ad'"
    )
    result_ref = store.put_json(keys.turn_key(RUN, "fix", 0, 0, "result.json"), result)
    item = GenerateItem(sample=0, previous=first.completion, observation=result_ref)
    second = (await generate(acts, request("fix", turn=1, items=[item]))).completions[0]
    assert second.completion.key == keys.turn_key(RUN, "fix", 0, 1, "completion.json")
    record = store.get_model(second.completion.key, CompletionRecord)
    earlier = store.get_model(first.completion.key, CompletionRecord)
    code_chat = await chat(acts)
    assert record.prompt_token_ids == code_chat.next_prompt(earlier, feedback_text(result))
    sampled = earlier.prompt_token_ids + earlier.completion_token_ids
    assert record.prompt_token_ids[: len(sampled)] == sampled  # never re-tokenized
    prompt = code_chat.tokenizer.decode(record.prompt_token_ids)
    assert "Tests passed: 0/2." in prompt and "NameError: name 'ad'" in prompt
    assert prompt.count("<|im_start|>assistant") == 2  # step 0's answer, then the new step


@pytest.mark.asyncio
async def test_a_workspace_step_returns_the_parsed_call(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5, stop_after_tool_call=True)
    req = request("ws", samples=2, env=EnvName.WORKSPACE, sampling=sampling)
    response = await generate(acts, req)
    for c in response.completions:
        assert c.code is None and c.call is not None
        assert c.call.error  # the untrained tiny model writes no valid call
        assert not store.exists(keys.turn_key(RUN, "ws", c.sample, 0, "code.py"))
    workspace_chat = await chat(acts, EnvName.WORKSPACE)
    first = response.completions[0].completion
    record = store.get_model(first.key, CompletionRecord)
    assert record.prompt_token_ids == workspace_chat.first_prompt(PROMPT)
    observation = store.put_text(keys.turn_key(RUN, "ws", 0, 0, "observation.txt"), "exit 0")
    item = GenerateItem(sample=0, previous=first, observation=observation)
    next_step = req.model_copy(update={"turn": 1, "items": [item]})
    (step,) = (await generate(acts, next_step)).completions
    prompt = store.get_model(step.completion.key, CompletionRecord).prompt_token_ids
    assert prompt == workspace_chat.next_prompt(record, "exit 0")
    assert "<tool_response>\nexit 0\n</tool_response>" in workspace_chat.tokenizer.decode(prompt)


@pytest.mark.asyncio
async def test_a_prompt_over_the_context_budget_is_reported_not_sampled(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    prompt_tokens = len((await chat(acts)).first_prompt(PROMPT))
    fits = request("budget", samples=1, max_context_tokens=prompt_tokens + 12)
    assert (await generate(acts, fits)).over_budget == {}
    over = request("budget-over", samples=2, max_context_tokens=prompt_tokens + 11)
    response = await generate(acts, over)
    assert response.completions == []
    assert response.over_budget == {0: prompt_tokens, 1: prompt_tokens}
    assert not list(store.list_keys(keys.tasks_prefix(RUN) + "budget-over/"))


@pytest.mark.asyncio
async def test_an_episode_trains_on_exactly_the_sampled_ids(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    """Three steps through the real activities: the learner's row is the sampled ids, with the
    mask on exactly the tokens the policy sampled, carrying their sampled log-probs."""
    files, tests = store.put_text("ws/files", "x"), store.put_text("ws/tests", "y")
    task = TaskSpec(
        id="tito",
        prompt=PROMPT,
        env=EnvName.WORKSPACE,
        workspace=WorkspaceSpec(files=files, verifier=tests),
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    steps: list[EpisodeStep] = []
    for k in range(3):
        item = GenerateItem(sample=0)
        if steps:
            item.previous, item.observation = steps[-1].completion, steps[-1].observation
        req = request(task.id, env=EnvName.WORKSPACE, sampling=sampling, turn=k, items=[item])
        (c,) = (await generate(acts, req)).completions
        observation = store.put_text(keys.turn_key(RUN, task.id, 0, k, "obs.txt"), f"result {k}")
        steps.append(
            EpisodeStep(
                step=k,
                policy_version=0,
                completion=c.completion,
                call=c.call,
                observation=observation,
            )
        )
    episode = EpisodeState(sample=0, steps=steps, end=EpisodeEnd.STEP_BUDGET, reward=1.0)
    other = EpisodeState(sample=1, steps=steps[:1], end=EpisodeEnd.SUBMITTED)
    written = await ActivityEnvironment().run(
        RewardActivities(store).write_trajectories,
        WriteTrajectoriesRequest(run_id=RUN, task=task, group_size=2, samples=[episode, other]),
    )
    trajectory = store.get_model(written.trajectories[0].key, Trajectory)
    records = [store.get_model(s.completion.key, CompletionRecord) for s in steps]
    assert trajectory.token_ids == records[-1].prompt_token_ids + records[-1].completion_token_ids
    mask = trajectory.loss_mask
    sampled = [t for t, m in zip(trajectory.token_ids, mask, strict=True) if m]
    assert sampled == [t for r in records for t in r.completion_token_ids]
    logprobs = [x for x, m in zip(trajectory.logprobs, mask, strict=True) if m]
    assert logprobs == [x for r in records for x in r.logprobs]
    spans = [trajectory.token_ids[a:b] for a, b in (s.span for s in trajectory.steps)]
    assert spans == [r.completion_token_ids for r in records]
    peer = store.get_model(written.trajectories[1].key, Trajectory)
    (row, _) = grpo.rows_from_group([trajectory, peer], 0, GRPOConfig()).rows
    assert row.input_ids == trajectory.token_ids and row.loss_mask == mask
    assert grpo.collate([row], pad_id=0).input_ids[0].tolist() == trajectory.token_ids


@pytest.mark.asyncio
async def test_invalid_requests_fail_without_retry(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    acts.policies.wait_s = 0.2  # a pinned version not published yet is waited for this long
    first = (await generate(acts, request("bad", samples=1))).completions[0]
    ref = first.completion
    forged = ref.model_copy(update={"sha256": "0" * 64})
    cases = [
        ("items", request("bad", items=[])),
        ("duplicate", request("bad", items=[GenerateItem(sample=1), GenerateItem(sample=1)])),
        ("items[0]: step 1 needs", request("bad", turn=1, items=[GenerateItem(sample=0)])),
        (
            "items[0]: step 1 needs",
            request("bad", turn=1, items=[GenerateItem(sample=0, previous=ref)]),
        ),
        (
            "items[0]: step 0 has no",
            request("bad", items=[GenerateItem(sample=0, previous=ref, observation=ref)]),
        ),
        (
            "items[0]: step 0 has no",
            request("bad", items=[GenerateItem(sample=0, observation=ref)]),
        ),
        (
            "items[0].previous",
            request(
                "bad", turn=1, items=[GenerateItem(sample=0, previous=forged, observation=ref)]
            ),
        ),
        ("policy_version 7", request("unpublished", policy_version=7)),
    ]
    for needle, bad in cases:
        with pytest.raises(
            ApplicationError, match=needle.replace("[", r"\[").replace("]", r"\]")
        ) as err:
            await generate(acts, bad)
        assert err.value.non_retryable, needle


@pytest.mark.asyncio
async def test_hot_reload_finishes_in_flight_work_on_the_old_version(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path
) -> None:
    acts.policies.latest_ttl_s = 0.0  # every request re-reads latest.json
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    backend.gate.clear()
    in_flight = asyncio.create_task(generate(acts, request("old", samples=2)))
    while acts.batcher.running == 0:  # its batch has started, on v0, and is held at the gate
        await asyncio.sleep(0.01)
    await asyncio.to_thread(publish_policy, store, RUN, 1, tiny_dir, 1)
    newer = asyncio.create_task(generate(acts, request("new", samples=2)))
    while acts.batcher.waiting < 2:  # resolved to v1, queued behind the running batch
        await asyncio.sleep(0.01)
    backend.gate.set()
    old, new = await asyncio.gather(in_flight, newer)
    assert old.policy_version == 0 and new.policy_version == 1
    for response, version in ((old, 0), (new, 1)):
        for c in response.completions:
            assert store.get_model(c.completion.key, CompletionRecord).policy_version == version
    pinned = await generate(acts, request("pinned", samples=1, policy_version=0))
    assert pinned.policy_version == 0
    assert sorted(backend.loaded_versions()) == [(RUN, 0), (RUN, 1)]


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
    while acts.batcher.running == 0:
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
    acts.heartbeat_s = 0.05
    backend.gate.clear()
    beats: list[object] = []
    held_env, doomed_env = ActivityEnvironment(), ActivityEnvironment()
    held_env.on_heartbeat = lambda *details: beats.append(details)
    held = asyncio.create_task(held_env.run(acts.generate, request("held", samples=2)))
    while acts.batcher.running == 0:
        await asyncio.sleep(0.01)
    doomed = asyncio.create_task(doomed_env.run(acts.generate, request("doomed", samples=3)))
    while acts.batcher.waiting < 3:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    assert len(beats) >= 3  # the event loop stays free while the batch is held
    doomed_env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert acts.batcher.waiting == 0
    backend.gate.set()
    assert len((await held).completions) == 2
    assert acts.batcher.rows == 2  # the cancelled samples were never generated
