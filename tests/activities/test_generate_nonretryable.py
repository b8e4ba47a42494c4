"""A generate step that can never succeed fails without retry: a policy whose chat template
refuses the step's messages (Gemma's and Mistral-Instruct's refuse a system message), fails on
a later turn's, or renders them in a way token-in/token-out cannot follow, and an observation
that is not its environment's. Each used to escape as a plain exception, which Temporal retried
for ever (`maximum_attempts` 0). Real SeaweedFS, the tiny preset, the local backend."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.inference import InferenceActivities
from contracts.errors import ErrorType
from contracts.rollout import GenerateItem
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName
from infra import keys
from infra.policy import publish_policy
from infra.storage import ObjectStore
from tests.activities.generation import RUN, GatedBackend, generate, request

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
)
GEMMA = (  # Gemma-1/2's test of the first message (Mistral-Instruct v0.1/v0.2's alike)
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}" + CHATML + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
ONE_EXCHANGE = (  # renders step 0 and the end of turn, refuses a second user message
    "{% if messages | length > 3 %}{{ raise_exception('one exchange only') }}{% endif %}"
    + CHATML
    + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ECHO = (  # writes the last message's text twice: its untrusted span cannot be told
    CHATML + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' + "
    "messages[-1]['content'] }}{% endif %}"
)


async def templated(store: ObjectStore, tiny_dir: Path, tmp_path: Path, template: str) -> str:
    """A run whose v0 is the tiny model with `template` as its chat template; its id."""
    run = "templated"
    path = tmp_path / run
    shutil.copytree(tiny_dir, path)
    (path / "chat_template.jinja").write_text(template)
    await asyncio.to_thread(publish_policy, store, run, 0, path)
    return run


def assert_invalid(err: pytest.ExceptionInfo[ApplicationError]) -> None:
    assert err.value.non_retryable and err.value.type == ErrorType.INVALID_INPUT.value


@pytest.mark.asyncio
async def test_a_template_that_refuses_a_system_message_fails_the_step_for_good(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    run = await templated(store, tiny_dir, tmp_path, GEMMA)
    for env in (EnvName.CODE, EnvName.WORKSPACE):
        req = request(f"gemma-{env.value}", samples=1, policy_run=run, env=env)
        with pytest.raises(ApplicationError) as err:
            await generate(acts, req)
        assert_invalid(err)
        assert err.value.message.startswith(
            f"policy {run}/v0: the chat template fails to render messages (system, user"
        )
        assert err.value.message.endswith("): TemplateError: System role not supported")
    backend = acts.backend
    assert isinstance(backend, GatedBackend) and backend.rows == 0


@pytest.mark.asyncio
async def test_a_template_that_fails_on_a_later_turn_fails_that_step_for_good(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """Step 0 renders; step 1's observation (a fourth message, rendered while the prompts are
    built, on a thread) is refused."""
    run = await templated(store, tiny_dir, tmp_path, ONE_EXCHANGE)
    first = (await generate(acts, request("later", samples=1, policy_run=run))).completions[0]
    result = ExecutionResult(status=ExecStatus.FAILED, tests_passed=0, tests_total=1)
    result_ref = store.put_json(keys.turn_key(RUN, "later", 0, 0, "result.json"), result)
    item = GenerateItem(sample=0, previous=first.completion, observation=result_ref)
    with pytest.raises(ApplicationError) as err:
        await generate(acts, request("later", turn=1, items=[item], policy_run=run))
    assert_invalid(err)
    assert err.value.message == (
        f"policy {run}/v0: the chat template fails to render messages "
        "(system, user, assistant, user): TemplateError: one exchange only"
    )


@pytest.mark.asyncio
async def test_a_template_that_renders_the_task_twice_fails_the_step_for_good(
    acts: InferenceActivities, store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """The policy's chat format is made (its end of turn found); the first prompt is not."""
    run = await templated(store, tiny_dir, tmp_path, ECHO)
    with pytest.raises(ApplicationError) as err:
        await generate(acts, request("echo", samples=1, policy_run=run))
    assert_invalid(err)
    assert err.value.message == (
        f"policy {run}/v0: the chat template does not render a message's text exactly once"
    )


@pytest.mark.asyncio
async def test_an_observation_that_is_not_an_execution_result_fails_for_good(
    acts: InferenceActivities, store: ObjectStore
) -> None:
    first = (await generate(acts, request("garbled", samples=1))).completions[0]
    garbled = store.put_text(keys.turn_key(RUN, "garbled", 0, 0, "result.json"), "not json")
    item = GenerateItem(sample=0, previous=first.completion, observation=garbled)
    with pytest.raises(ApplicationError) as err:
        await generate(acts, request("garbled", turn=1, items=[item]))
    assert_invalid(err)
    assert err.value.message == (
        f"items[0].observation: {garbled.key}: <input>: Invalid JSON: expected ident at line 1 "
        "column 2"
    )
