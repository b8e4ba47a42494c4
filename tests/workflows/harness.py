"""Helpers for workflow tests: workers in this process, scripted stand-ins for the model.

Only the model is scripted (`ScriptedModel` writes chosen programs where the inference activity
would write sampled ones); Temporal, S3 and the sandbox are the real ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from contracts.names import Activity, Queue
from contracts.rollout import Completion, CompletionRecord, GenerateRequest, GenerateResponse
from infra import keys
from infra.storage import ObjectStore


async def connect(address: str, namespace: str) -> Client:
    return await Client.connect(
        address, namespace=namespace, data_converter=pydantic_data_converter
    )


@contextlib.asynccontextmanager
async def running_workers(
    client: Client, by_queue: dict[Queue, dict[str, Sequence[Any]]]
) -> AsyncIterator[None]:
    """Run one Worker per queue (kwargs: activities=…, workflows=…) for the `with` block."""
    workers = [
        Worker(client, task_queue=queue.value, max_concurrent_activities=16, **kwargs)
        for queue, kwargs in by_queue.items()
    ]
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


class ScriptedModel:
    """A `generate` activity whose program for (sample, turn) is `script(sample, turn)`."""

    def __init__(self, store: ObjectStore, script: Callable[[int, int], str], version: int = 0):
        self.store, self.script, self.version = store, script, version
        self.calls: list[GenerateRequest] = []

    @activity.defn(name=Activity.GENERATE.value)
    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        self.calls.append(request)
        completions = []
        for item in request.items:
            code = self.script(item.sample, request.turn)
            text = f"```python\n{code}\n```"

            def key(name: str, sample: int = item.sample) -> str:
                return keys.turn_key(request.run_id, request.task_id, sample, request.turn, name)

            record = CompletionRecord(
                text=text,
                prompt_token_ids=[1, 2, 3],
                completion_token_ids=[4, 5],
                logprobs=[-0.5, -0.25],
                policy_version=self.version,
            )
            completions.append(
                Completion(
                    sample=item.sample,
                    completion=self.store.put_json(key("completion.json"), record),
                    code=self.store.put_text(key("code.py"), code),
                    num_tokens=2,
                )
            )
        return GenerateResponse(policy_version=self.version, completions=completions)
