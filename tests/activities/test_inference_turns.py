"""What the generate activity tells a `workspace` episode about its own turns: a call its token
limit cut (finish reason "length") is told so, not only as broken JSON, and the next prompt
says which calls of a turn were not run. Real SeaweedFS, the tiny preset, the local backend."""

from __future__ import annotations

import pytest

from activities.inference import InferenceActivities
from contracts.episode import ToolCall
from contracts.rollout import CompletionRecord, GenerateItem
from contracts.task import EnvName
from infra import keys
from infra.storage import ObjectStore
from tests.activities.generation import PROMPT, RUN, chat, generate, request
from tests.infra.inference.scripted import render_tool_call

CUT = '<tool_call>\n{"name": "write_file", "arguments": {"path": "m.py", "content": "def f(x):\n'


async def stored_turn(
    acts: InferenceActivities, store: ObjectStore, task: str, text: str, finish: str
) -> CompletionRecord:
    """Turn 0 of `task`'s sample 0 as an earlier attempt stored it (nothing is sampled)."""
    workspace_chat = await chat(acts, EnvName.WORKSPACE)
    record = CompletionRecord(
        text=text,
        prompt_token_ids=workspace_chat.first_prompt(PROMPT),
        completion_token_ids=[5] * 12,
        logprobs=[-0.5] * 12,
        policy_version=0,
        finish_reason=finish,
    )
    store.put_json(keys.turn_key(RUN, task, 0, 0, "completion.json"), record)
    return record


@pytest.mark.asyncio
async def test_a_call_its_token_limit_cut_is_told_as_cut(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    await stored_turn(acts, store, "ws-cut", CUT, "length")
    (c,) = (await generate(acts, request("ws-cut", samples=1, env=EnvName.WORKSPACE))).completions
    assert c.call is not None and c.call.error is not None
    assert c.call.error.startswith(
        "the turn ran out of its 12 tokens before the call was complete (Unterminated string"
    )
    await stored_turn(acts, store, "ws-stopped", CUT, "stop")  # it stopped: its JSON is wrong
    req = request("ws-stopped", samples=1, env=EnvName.WORKSPACE)
    (c,) = (await generate(acts, req)).completions
    assert c.call is not None and c.call.error == (
        "the tool call is not valid JSON: Unterminated string (position 64)"
    )


@pytest.mark.asyncio
async def test_the_next_prompt_says_which_calls_were_not_run(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    ls = render_tool_call(ToolCall(name="bash", arguments={"command": "ls"}))
    text = f"{ls}\n{render_tool_call(ToolCall(name='submit'))}"
    await stored_turn(acts, store, "ws-two", text, "stop")
    req = request("ws-two", samples=1, env=EnvName.WORKSPACE)
    (first,) = (await generate(acts, req)).completions
    assert first.call == ToolCall(name="bash", arguments={"command": "ls"})
    observation = store.put_text(keys.turn_key(RUN, "ws-two", 0, 0, "observation.txt"), "a.py")
    item = GenerateItem(sample=0, previous=first.completion, observation=observation)
    (step,) = (
        await generate(acts, req.model_copy(update={"turn": 1, "items": [item]}))
    ).completions
    prompt = store.get_model(step.completion.key, CompletionRecord).prompt_token_ids
    shown = (await chat(acts, EnvName.WORKSPACE)).tokenizer.decode(prompt)
    assert shown.endswith(
        "<tool_response>\na.py\n(1 further call ignored: one call per turn)\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
