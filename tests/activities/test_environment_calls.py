"""`env_step` with the briefs of large calls, real bwrap and a real SeaweedFS: an item's call
whose brief was cut runs whole, parsed again from the turn's record (a file of 68 KB is written
whole, an error call's observation names the whole error), the outcome carries the brief; a
record the store does not hold is a retryable storage fault, one that gives another call a
non-retryable InvalidInput. Fixtures and helpers: test_environment.py."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.common import ObjectRef
from contracts.episode import WORKSPACE_TOOLS, EnvStepRequest, ToolCall
from contracts.errors import ErrorType
from contracts.rollout import CompletionRecord
from infra.inference.toolcalls import parse_tool_call
from infra.storage import ObjectStore, TransientStorageError
from tests.activities.test_environment import acts, open_two, step  # noqa: F401 (a fixture)
from tests.infra.environments.conftest import needs_root
from tests.infra.inference.scripted import render_tool_call

pytestmark = [needs_root, pytest.mark.asyncio]
BIG = "print('a line of a realistic source file')\n" * 1600  # 68,800 characters


def turn(store: ObjectStore, key: str, text: str) -> tuple[ObjectRef, ToolCall]:
    """A turn's stored record holding `text`, and the brief of its call (as generate gives)."""
    record = CompletionRecord(
        text=text, prompt_token_ids=[1], completion_token_ids=[2], logprobs=[0.0], policy_version=0
    )
    return store.put_json(key, record), parse_tool_call(text, WORKSPACE_TOOLS).brief()


def write_turn(store: ObjectStore, key: str, content: str) -> tuple[ObjectRef, ToolCall]:
    """`turn` of a call writing `content` to big.py."""
    write = ToolCall(name="write_file", arguments={"path": "big.py", "content": content})
    return turn(store, key, render_tool_call(write))


def with_completion(request: EnvStepRequest, completion: ObjectRef) -> EnvStepRequest:
    items = [item.model_copy(update={"completion": completion}) for item in request.items]
    return request.model_copy(update={"items": items})


async def test_a_cut_call_runs_whole_from_its_record(
    acts: EnvironmentActivities,  # noqa: F811
    store: ObjectStore,
) -> None:
    sessions = await open_two(acts)
    ref, brief = write_turn(store, "turns/0/completion.json", BIG)
    assert brief.cut and len(brief.arguments["content"]) < 300
    request = with_completion(step(sessions, 0, {0: brief}), ref)
    (outcome,) = (await ActivityEnvironment().run(acts.env_step, request)).outcomes
    assert outcome.call == brief  # what goes back to the workflow stays the brief
    count = ToolCall(name="bash", arguments={"command": "wc -c < big.py"})
    sessions = {0: outcome.session}
    (counted,) = (
        await ActivityEnvironment().run(acts.env_step, step(sessions, 1, {0: count}))
    ).outcomes
    assert store.get_text(counted.observation.key) == f"exit code: 0\nstdout:\n{len(BIG)}"

    name = "n" * 5000  # an unknown tool: its error repeats the name, and is cut in the brief
    ref, brief = turn(store, "turns/2/completion.json", f'<tool_call>{{"name": "{name}"}}')
    assert brief.cut and brief.error and name not in brief.error
    request = with_completion(step(sessions, 2, {0: brief}), ref)
    (outcome,) = (await ActivityEnvironment().run(acts.env_step, request)).outcomes
    observation = store.get_text(outcome.observation.key)
    assert observation.startswith("error: unknown tool") and name in observation


async def test_a_cut_calls_record_that_cannot_be_read_or_differs_fails_clearly(
    acts: EnvironmentActivities,  # noqa: F811
    store: ObjectStore,
) -> None:
    sessions = await open_two(acts)
    ref, brief = write_turn(store, "turns/0/completion.json", BIG)
    missing = ref.model_copy(update={"key": "turns/gone/completion.json"})
    request = with_completion(step(sessions, 0, {0: brief}), missing)
    with pytest.raises(TransientStorageError, match="turns/gone/completion.json.*not in the store"):
        await ActivityEnvironment().run(acts.env_step, request)

    other_ref, _ = write_turn(store, "turns/other/completion.json", BIG + "#")
    request = with_completion(step(sessions, 0, {0: brief}), other_ref)
    with pytest.raises(ApplicationError, match="does not parse to the call") as refused:
        await ActivityEnvironment().run(acts.env_step, request)
    assert refused.value.type == ErrorType.INVALID_INPUT and refused.value.non_retryable
