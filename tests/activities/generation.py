"""What the generate activity's tests share: a run with the tiny preset published as v0, a backend
that can hold a batch in flight, and one request shape (test_inference.py,
test_inference_concurrency.py; the `acts` fixture is in conftest.py)."""

from __future__ import annotations

import asyncio

from temporalio.testing import ActivityEnvironment

from activities.inference import InferenceActivities
from contracts.rollout import GenerateItem, GenerateRequest, GenerateResponse
from contracts.task import EnvName, SamplingParams
from infra.inference import GenerationOutput, PolicyHandle
from infra.inference.local import LocalBackend
from infra.inference.prompts import ChatFormat
from infra.settings import LocalInferenceSettings

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
