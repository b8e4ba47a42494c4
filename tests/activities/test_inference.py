"""The generate activity with a real SeaweedFS, real published policies (the tiny preset) and
the real local backend: stored records, token-in/token-out steps for both environments, the
context budget, invalid input; and an episode from sampling to the learner's row. Concurrent
work (hot reload, overlapping attempts, cancels, the format cache): test_inference_concurrency.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.inference import InferenceActivities, sample_params
from activities.rewards import RewardActivities
from contracts.episode import WORKSPACE_TOOLS, EpisodeEnd, ToolCall
from contracts.learner import GRPOConfig
from contracts.rollout import (
    CompletionRecord,
    EpisodeState,
    EpisodeStep,
    GenerateItem,
    WriteTrajectoriesRequest,
)
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SamplingParams, TaskSpec, WorkspaceSpec
from contracts.trajectory import Trajectory
from infra import grpo, keys
from infra.inference.prompts import extract_code, feedback_text
from infra.inference.toolcalls import full_call, parse_tool_call
from infra.policy import latest_policy, publish_policy
from infra.settings import InferenceSettings, LocalInferenceSettings, Settings
from infra.storage import ObjectStore
from tests.activities.generation import PROMPT, RUN, GatedBackend, chat, generate, request
from tests.infra.inference.scripted import render_tool_call


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
    again = await generate(acts, request("add", run_id=f"{RUN}-again"))  # same seeds, same tokens
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
async def test_a_record_says_the_temperature_its_log_probs_were_taken_at(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    """The sampler takes each token's log-prob at the row's temperature (1 when greedy) and the
    record says which, for the learner to recompute them at the same."""
    for temperature, expected in ((0.6, 0.6), (0.0, 1.0)):
        sampling = SamplingParams(temperature=temperature, max_new_tokens=4, seed=1)
        response = await generate(acts, request(f"t{temperature}", samples=1, sampling=sampling))
        record = store.get_model(response.completions[0].completion.key, CompletionRecord)
        assert record.logprob_temperature == expected


@pytest.mark.asyncio
async def test_a_retry_reuses_what_an_earlier_attempt_stored(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path
) -> None:
    unseeded = SamplingParams(temperature=1.0, max_new_tokens=6)
    backend = acts.backend
    assert isinstance(backend, GatedBackend)
    partial = await generate(acts, request("retry", samples=1, sampling=unseeded))
    rows_before = backend.rows
    # v1 appears; the retry covers samples 0 and 1: sample 0 is reused as stored, sample 1 is
    # sampled from v0 too, so one turn never mixes versions.
    await asyncio.to_thread(publish_policy, store, RUN, 1, tiny_dir, 1)
    acts.policies.latest_ttl_s = 0.0
    retry = await generate(acts, request("retry", samples=2, sampling=unseeded))
    assert retry.policy_version == 0
    assert retry.completions[0] == partial.completions[0]  # same refs, same bytes
    assert backend.rows == rows_before + 1
    record = store.get_model(retry.completions[1].completion.key, CompletionRecord)
    assert record.policy_version == 0
    # an overlapping attempt that sampled v1 before it saw sample 0 stored: the stored v0
    # completion wins, and the completion says v0 whatever the attempt's version
    item, late = request("retry").items[0], record.model_copy(update={"policy_version": 1})
    adopted = await asyncio.to_thread(acts._write, request("retry"), item, late)
    assert adopted.policy_version == 0 and adopted == retry.completions[0]
    with pytest.raises(ApplicationError, match="policy_version") as pinned:
        await generate(acts, request("retry", samples=2, policy_version=1))
    assert pinned.value.non_retryable
    with pytest.raises(ApplicationError, match="another prompt") as changed:
        await generate(acts, request("retry", samples=1, prompt="Write sub(a, b)."))
    assert changed.value.non_retryable


def test_a_seeded_row_has_its_own_stream_per_task_sample_and_turn() -> None:
    """The same (seed, task, sample, turn) gives the same seed on every machine; any other gives
    another: before, every task's sample s at turn t drew from one stream, so the groups of a
    seeded run shared their sampling noise."""
    base = SamplingParams(seed=5)
    rows = [(task, s, t) for task in ("add-1", "add-2") for s in range(8) for t in range(3)]
    seeds = [sample_params(base, task, s, t).seed for task, s, t in rows]
    assert len(set(seeds)) == len(rows)
    assert all(seed is not None and 0 <= seed < 2**63 for seed in seeds)
    assert sample_params(base, "add-1", 2, 1).seed == 0x776BEDF6F8C021E  # fixed, not per process
    assert sample_params(SamplingParams(seed=6), "add-1", 2, 1).seed != seeds[7]
    assert sample_params(SamplingParams(seed=None), "add-1", 2, 1).seed is None


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
    guided = sampling.model_copy(update={"max_new_tokens": 400, "tool_choice": "required"})
    req_guided = request("ws-guided", samples=2, env=EnvName.WORKSPACE, sampling=guided)
    for c in (await generate(acts, req_guided)).completions:  # the same model, guided
        assert c.call is not None and c.call.error is None, c.call
        text = store.get_model(c.completion.key, CompletionRecord).text
        assert c.call == parse_tool_call(text, WORKSPACE_TOOLS).brief()  # what env_step gets
        assert full_call(c.call, text, WORKSPACE_TOOLS) == parse_tool_call(text, WORKSPACE_TOOLS)
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
async def test_a_workspace_call_comes_back_as_its_brief(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    """A turn that writes a 69 KB file (stored by an earlier attempt, so nothing is sampled):
    the completion carries the call cut to its brief; the record gives the call back whole."""
    call = ToolCall(name="write_file", arguments={"path": "big.py", "content": "x = 1\n" * 11_500})
    workspace_chat = await chat(acts, EnvName.WORKSPACE)
    record = CompletionRecord(
        text=f"I write it.\n{render_tool_call(call)}",
        prompt_token_ids=workspace_chat.first_prompt(PROMPT),
        completion_token_ids=[5, 6],
        logprobs=[-0.5, -0.5],
        policy_version=0,
    )
    store.put_json(keys.turn_key(RUN, "ws-big", 0, 0, "completion.json"), record)
    req = request("ws-big", samples=1, env=EnvName.WORKSPACE)
    (c,) = (await generate(acts, req)).completions
    assert c.call is not None and c.call.cut and c.call.name == "write_file"
    assert len(c.model_dump_json()) < 2048
    assert full_call(c.call, record.text, WORKSPACE_TOOLS) == call


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
async def test_the_engines_own_bound_is_the_context_budget_where_it_is_lower(
    acts: InferenceActivities, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's budget of 4,096 tokens on an engine that holds fewer (vLLM's `max_model_len`,
    2,048 by default; or the model's positions): the engine cut such rows short without a
    word, or sampled nothing; the episode ends as `context_budget` now."""
    prompt_tokens = len((await chat(acts)).first_prompt(PROMPT))
    monkeypatch.setattr(acts.backend, "max_model_len", prompt_tokens + 11)  # 12 new tokens
    over = request("engine-bound", samples=1, max_context_tokens=4096)
    assert (await generate(acts, over)).over_budget == {0: prompt_tokens}
    monkeypatch.setattr(acts.backend, "max_model_len", None)  # the tiny model's 2,048 positions
    assert await acts.context_limit(await acts.policies.resolve(RUN, 0)) == 2048


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
        (
            "sampling.tool_choice: 'required' needs tools; code has none",
            request("bad", sampling=SamplingParams(tool_choice="required")),
        ),
    ]
    for needle, bad in cases:
        with pytest.raises(
            ApplicationError, match=needle.replace("[", r"\[").replace("]", r"\]")
        ) as err:
            await generate(acts, bad)
        assert err.value.non_retryable, needle


@pytest.mark.asyncio
async def test_a_stored_record_that_does_not_validate_fails_without_retry(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    """A record of a newer release (a field this one does not know) fails the step naming the
    item: pydantic's error used to escape as a retryable one, and the step was retried for ever."""
    first = (await generate(acts, request("newer", samples=1))).completions[0]
    record = store.get_model(first.completion.key, CompletionRecord).model_dump()
    newer = store.put_json(keys.turn_key(RUN, "newer", 0, 0, "newer.json"), {**record, "new": 1})
    item = GenerateItem(sample=0, previous=newer, observation=first.completion)
    with pytest.raises(ApplicationError, match=r"items\[0\]\.previous: .*newer\.json") as err:
        await generate(acts, request("newer", turn=1, items=[item]))
    assert err.value.non_retryable
    # an earlier attempt's record, read back by a retry to be reused
    store.put_json(keys.turn_key(RUN, "stored", 0, 0, "completion.json"), {**record, "new": 1})
    with pytest.raises(ApplicationError, match=r"items\[0\]: .*completion\.json") as err:
        await generate(acts, request("stored", samples=1))
    assert err.value.non_retryable
