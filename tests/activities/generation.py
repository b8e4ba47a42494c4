"""What the generate activity's tests share: a run with the tiny preset published as v0, a backend
that can hold rows in flight, and one request shape (test_inference.py,
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
    """The local backend (continuously batched, as every backend), holding each call until
    `gate` opens (to hold rows in flight); it counts the rows held and the rows it sampled."""

    def __init__(self, config: LocalInferenceSettings):
        super().__init__(config)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0
        """Rows waiting at the gate now (a cancelled caller's leave)."""
        self.rows = 0
        """Rows sampled."""

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        self.held += len(prompts)
        try:
            await self.gate.wait()
        finally:
            self.held -= len(prompts)
        outputs = await super().generate(prompts, params, policy)
        self.rows += len(outputs)
        return outputs


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
