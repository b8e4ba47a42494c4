"""The `generate` activity (queue `inference`): one turn of G samples of one agent task.

For every item (sample) it renders the chat prompt (task prompt, then each earlier turn's
completion and execution feedback, read from S3), tokenizes it once with the policy's chat
template, and submits it to the worker's shared `Batcher`, which coalesces rows from every
concurrently running activity into batched backend calls. Each completion is written to
`keys.turn_key(run, task, sample, turn, "completion.json")` (a `CompletionRecord`: the exact
prompt and completion token ids and log-probs the learner trains on) and `code.py`.

Policy: `req.policy_version` None means the newest published version of `req.policy_run`
(re-read every couple of seconds, so a hot reload needs no restart); a number means exactly
that version. Seeds: with `sampling.seed = s`, sample i of turn t uses `s + 1000 * i + t`, so a
retried activity reproduces its completions.

Errors: storage and inference infrastructure failures are retryable; a request that can never
succeed (no items, duplicate samples, a history turn without its execution result or whose
artefacts are missing, an unpublished pinned version) raises a non-retryable ApplicationError
naming the field. Served by `tempered worker inference` (workers/inference.py).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts.names import Activity
from contracts.rollout import (
    Completion,
    CompletionRecord,
    GenerateItem,
    GenerateRequest,
    GenerateResponse,
)
from contracts.sandbox import ExecutionResult
from contracts.task import SamplingParams
from infra import keys
from infra.inference import (
    Batcher,
    BatchResult,
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
    get_backend,
)
from infra.inference.prompts import build_messages, encode_messages, extract_code
from infra.settings import Settings
from infra.storage import ObjectNotFound, ObjectStore

T = TypeVar("T")
HEARTBEAT_S = 2.0
MAX_TOKENIZERS = 4


def _invalid(field: str, why: str) -> ApplicationError:
    return ApplicationError(f"{field}: {why}", type="InvalidInput", non_retryable=True)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def sample_params(sampling: SamplingParams, sample: int, turn: int) -> SamplingParams:
    """The params of one row: the request's, with seed `seed + 1000 * sample + turn` if seeded."""
    if sampling.seed is None:
        return sampling
    return sampling.model_copy(update={"seed": sampling.seed + 1000 * sample + turn})


async def _heartbeating(awaitable: Awaitable[T], interval_s: float = HEARTBEAT_S) -> T:
    """Await `awaitable`, heartbeating every `interval_s` (and cancelling it if we are)."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        task.cancel()


class InferenceActivities:
    """Activities of the inference queue: one backend, one batcher, one policy cache per worker."""

    def __init__(
        self,
        settings: Settings,
        store: ObjectStore | None = None,
        backend: InferenceBackend | None = None,
    ):
        self.settings = settings
        self.store = store or ObjectStore.from_settings(settings)
        self.backend = backend or get_backend(settings)
        inference = settings.inference
        self.batcher = Batcher(self.backend, inference.max_batch, inference.max_wait_ms)
        self.policies = PolicyResolver(self.store, settings.home / "cache" / "policies")
        self._tokenizers: OrderedDict[Path, Any] = OrderedDict()

    @activity.defn(name=Activity.GENERATE)
    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        self._validate(req)
        try:
            policy = await self.policies.resolve(req.policy_run, req.policy_version)
            tokenizer = await self._tokenizer(policy)
            prompts = await asyncio.gather(
                *(
                    asyncio.to_thread(self._prompt_ids, tokenizer, req, index, item)
                    for index, item in enumerate(req.items)
                )
            )
            started_at = _now()
            submits = [
                self.batcher.submit(ids, sample_params(req.sampling, item.sample, req.turn), policy)
                for ids, item in zip(prompts, req.items, strict=True)
            ]
            results = await _heartbeating(asyncio.gather(*submits))
        except InferenceError as exc:
            raise ApplicationError(
                str(exc), type="InferenceError", non_retryable=not exc.retryable
            ) from exc
        finished_at = _now()
        completions = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self._write, req, item, ids, result, tokenizer, started_at, finished_at
                )
                for item, ids, result in zip(req.items, prompts, results, strict=True)
            )
        )
        tokens = sum(c.num_tokens for c in completions)
        weighted = sum(len(r.output.token_ids) * r.batch_tokens_per_s for r in results)
        return GenerateResponse(
            policy_version=policy.version,
            completions=list(completions),
            tokens_per_s=round(weighted / tokens, 2) if tokens else 0.0,
        )

    @staticmethod
    def _validate(req: GenerateRequest) -> None:
        if not req.items:
            raise _invalid("items", "no samples to generate for")
        samples = [item.sample for item in req.items]
        if len(set(samples)) != len(samples):
            raise _invalid("items", f"duplicate sample indices {samples}")
        for i, item in enumerate(req.items):
            for k, turn in enumerate(item.history):
                if turn.result is None:
                    raise _invalid(f"items[{i}].history[{k}].result", "turn was never executed")

    async def _tokenizer(self, policy: PolicyHandle) -> Any:
        if policy.path not in self._tokenizers:
            from transformers import AutoTokenizer

            loaded = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(policy.path))
            self._tokenizers[policy.path] = loaded
            while len(self._tokenizers) > MAX_TOKENIZERS:
                self._tokenizers.popitem(last=False)
        self._tokenizers.move_to_end(policy.path)
        return self._tokenizers[policy.path]

    def _prompt_ids(
        self, tokenizer: Any, req: GenerateRequest, index: int, item: GenerateItem
    ) -> list[int]:
        """Render and tokenize one sample's conversation (blocking: reads history from S3)."""
        history: list[tuple[str, ExecutionResult]] = []
        for k, turn in enumerate(item.history):
            field = f"items[{index}].history[{k}]"
            assert turn.result is not None  # checked by _validate
            try:
                record = self.store.get_model(turn.completion.key, CompletionRecord)
                result = self.store.get_model(turn.result.key, ExecutionResult)
            except ObjectNotFound as exc:
                raise _invalid(field, f"artefact missing from the store: {exc}") from exc
            history.append((record.text, result))
        return encode_messages(tokenizer, build_messages(req.prompt, history))

    def _write(
        self,
        req: GenerateRequest,
        item: GenerateItem,
        prompt_ids: list[int],
        result: BatchResult,
        tokenizer: Any,
        started_at: str,
        finished_at: str,
    ) -> Completion:
        """Store completion.json and code.py of one sample (blocking)."""
        output = result.output
        text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
        record = CompletionRecord(
            text=text,
            prompt_token_ids=prompt_ids,
            completion_token_ids=output.token_ids,
            logprobs=output.logprobs,
            policy_version=result.policy.version,
            finish_reason=output.finish_reason,
            started_at=started_at,
            finished_at=finished_at,
        )
        key = keys.turn_key
        completion_ref = self.store.put_json(
            key(req.run_id, req.task_id, item.sample, req.turn, "completion.json"), record
        )
        code_ref = self.store.put_text(
            key(req.run_id, req.task_id, item.sample, req.turn, "code.py"), extract_code(text)
        )
        return Completion(
            sample=item.sample,
            completion=completion_ref,
            code=code_ref,
            num_tokens=len(output.token_ids),
            finish_reason=output.finish_reason,
        )

    async def close(self) -> None:
        await self.batcher.close()
        await self.backend.close()
