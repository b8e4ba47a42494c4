"""The generate activity reads a turn as its prompt began it: a policy whose chat template opens
the think block in the generation prompt (Qwen3-*-Thinking-2507, the R1 distills) writes only
`</think>`, and a call it drafted before that is no call (`infra.inference.calltags`)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from activities.inference import InferenceActivities
from contracts.episode import ToolCall
from contracts.rollout import CompletionRecord
from contracts.task import EnvName
from infra import keys
from infra.policy import publish_policy
from infra.storage import ObjectStore
from tests.activities.generation import PROMPT, generate, request

THINKING_2507 = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
REAL = '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>'
DRAFT = '<tool_call>\n{"name": "bash", "arguments": {"command": "rm -rf src"}}\n</tool_call>'
RUN = "run-think"


async def thinking_policy(
    acts: InferenceActivities, store: ObjectStore, tiny: Path, at: Path
) -> list[int]:
    """The tiny model published under a template that opens the think block; its first prompt."""
    model = at / "thinking"
    shutil.copytree(tiny, model)
    (model / "chat_template.jinja").write_text(THINKING_2507)
    await asyncio.to_thread(publish_policy, store, RUN, 0, model)
    chat = await acts.chat_format(await acts.policies.resolve(RUN), EnvName.WORKSPACE)
    prompt = chat.first_prompt(PROMPT)
    assert chat.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    return prompt


@pytest.mark.asyncio
async def test_a_turn_sampled_after_an_opened_think_block_is_recorded_so(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """The record says how its text reads (`CompletionRecord.thinking`), so that the activities
    that parse a cut call again (environment, rewards) read it as generate did."""
    await thinking_policy(acts, store, tiny_dir, tmp_path)
    req = request("sampled", samples=1, env=EnvName.WORKSPACE, run_id=RUN, policy_run=RUN)
    (completion,) = (await generate(acts, req)).completions
    record = store.get_model(completion.completion.key, CompletionRecord)
    assert record.thinking


@pytest.mark.asyncio
async def test_a_call_drafted_in_the_think_block_the_template_opened_is_not_run(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    prompt = await thinking_policy(acts, store, tiny_dir, tmp_path)
    # stored by an earlier attempt (which recorded how it began): nothing is sampled, the
    # stored turn is parsed as it says
    record = CompletionRecord(
        text=f"Maybe {DRAFT} no, that deletes the code.\n</think>\n\n{REAL}",
        prompt_token_ids=prompt,
        completion_token_ids=[5, 6],
        logprobs=[-0.5, -0.5],
        policy_version=0,
        thinking=True,
    )
    store.put_json(keys.turn_key(RUN, "think", 0, 0, "completion.json"), record)
    req = request("think", samples=1, env=EnvName.WORKSPACE, run_id=RUN, policy_run=RUN)
    (completion,) = (await generate(acts, req)).completions
    assert completion.call == ToolCall(name="bash", arguments={"command": "pytest -q"})
