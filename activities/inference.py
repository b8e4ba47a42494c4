"""The `generate` activity (queue `inference`): one turn of G samples of one agent task.

For every item (sample) it renders the chat prompt (task prompt, then each earlier turn's
completion and execution feedback, read from S3), tokenizes it once with the policy's chat
template, and submits it to the worker's shared `Batcher`, which coalesces rows from every
concurrently running activity into batched backend calls. Each completion is written to
`keys.turn_key(run, task, sample, turn, "completion.json")` (a `CompletionRecord`: the exact
prompt and completion token ids and log-probs the learner trains on) and `code.py`.

Policy: `req.policy_version` None means the newest published version of `req.policy_run`
(re-read every couple of seconds, so a hot reload needs no restart); a number means exactly
that version. Seeds: with `sampling.seed = s`, sample i of turn t uses `s + 1000 * i + t`
(not `s + i`: every turn of a sample gets its own stream), so a seeded run is reproducible.

Retries: turn artefacts are written create-only. An attempt first reads what earlier attempts
stored for its samples, reuses those records (after checking they answer the same prompt),
samples the rest from the same policy version, and never overwrites: if an overlapping attempt
stores a sample first, that record wins. A returned ref therefore always matches its bytes.

Errors: storage and inference infrastructure failures are retryable; a request that can never
succeed (no items, duplicate samples, a history turn without its execution result or whose
artefacts are missing, an unpublished pinned version) raises a non-retryable ApplicationError
naming the field. Served by `tempered worker inference` (workers/inference.py).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.heartbeat import heartbeating
from contracts.errors import ErrorType, fail, invalid
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
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
    get_backend,
)
from infra.inference.prompts import build_messages, encode_messages, extract_code
from infra.settings import Settings
from infra.storage import ObjectExists, ObjectNotFound, ObjectStore

COMPLETION = "completion.json"
CODE = "code.py"
HEARTBEAT_S = 2.0
MAX_TOKENIZERS = 4


def _version(req: GenerateRequest, stored: list[CompletionRecord | None]) -> int | None:
    """The version to sample: the request's, or the one an earlier attempt already used."""
    earlier = {record.policy_version for record in stored if record is not None}
    if not earlier:
        return req.policy_version
    version = min(earlier)
    if req.policy_version is not None and earlier != {req.policy_version}:
        raise invalid("policy_version", f"turn already stored from version(s) {sorted(earlier)}")
    return version


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def sample_params(sampling: SamplingParams, sample: int, turn: int) -> SamplingParams:
    """The params of one row: the request's, with seed `seed + 1000 * sample + turn` if seeded."""
    if sampling.seed is None:
        return sampling
    return sampling.model_copy(update={"seed": sampling.seed + 1000 * sample + turn})


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
        self.policies = PolicyResolver(
            self.store, settings.home / "cache" / "policies", bootstrap=self._publish_base_model
        )
        self._tokenizers: OrderedDict[Path, Any] = OrderedDict()
        self.heartbeat_s = HEARTBEAT_S

    def _publish_base_model(self, run_id: str) -> int:
        """Version 0 of a run started without a training run: `settings.inference.base_model`."""
        from infra.policy import materialize_base_model, publish_policy

        local_dir = materialize_base_model(
            self.settings.inference.base_model, self.settings, self.store
        )
        return publish_policy(self.store, run_id, 0, local_dir).version

    @activity.defn(name=Activity.GENERATE)
    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        self._validate(req)
        try:  # heartbeats flow through downloads, model loads and queueing alike
            return await heartbeating(self._generate(req), every_s=self.heartbeat_s)
        except InferenceError as exc:
            kind = ErrorType.INFERENCE if exc.retryable else ErrorType.INVALID_INPUT
            raise fail(kind, str(exc)) from exc

    async def _generate(self, req: GenerateRequest) -> GenerateResponse:
        stored = await asyncio.gather(
            *(asyncio.to_thread(self._stored, req, item) for item in req.items)
        )
        policy = await self.policies.resolve(req.policy_run, _version(req, stored))
        tokenizer = await self.tokenizer(policy)
        prompts = await asyncio.gather(
            *(
                asyncio.to_thread(self._prompt_ids, tokenizer, req, index, item)
                for index, item in enumerate(req.items)
            )
        )
        for index, (record, prompt) in enumerate(zip(stored, prompts, strict=True)):
            if record is not None and record.prompt_token_ids != prompt:
                raise invalid(f"items[{index}]", "turn already stored for another prompt")
        todo = [i for i, record in enumerate(stored) if record is None]
        started_at = _now()
        results = await asyncio.gather(
            *(
                self.batcher.submit(
                    prompts[i], sample_params(req.sampling, req.items[i].sample, req.turn), policy
                )
                for i in todo
            )
        )
        finished_at = _now()
        fresh = {
            i: CompletionRecord(
                text=tokenizer.decode(result.output.token_ids, skip_special_tokens=True),
                prompt_token_ids=prompts[i],
                completion_token_ids=result.output.token_ids,
                logprobs=result.output.logprobs,
                policy_version=result.policy.version,
                finish_reason=result.output.finish_reason,
                started_at=started_at,
                finished_at=finished_at,
            )
            for i, result in zip(todo, results, strict=True)
        }
        completions = await asyncio.gather(
            *(
                asyncio.to_thread(self._write, req, item, fresh[i] if i in fresh else stored[i])
                for i, item in enumerate(req.items)
            )
        )
        tokens = sum(len(r.output.token_ids) for r in results)
        weighted = sum(len(r.output.token_ids) * r.batch_tokens_per_s for r in results)
        return GenerateResponse(
            policy_version=policy.version,
            completions=list(completions),
            tokens_per_s=round(weighted / tokens, 2) if tokens else 0.0,
        )

    @staticmethod
    def _validate(req: GenerateRequest) -> None:
        if not req.items:
            raise invalid("items", "no samples to generate for")
        samples = [item.sample for item in req.items]
        if len(set(samples)) != len(samples):
            raise invalid("items", f"duplicate sample indices {samples}")
        for i, item in enumerate(req.items):
            for k, turn in enumerate(item.history):
                if turn.result is None:
                    raise invalid(f"items[{i}].history[{k}].result", "turn was never executed")

    async def tokenizer(self, policy: PolicyHandle) -> Any:
        """The policy's tokenizer (a few are kept loaded)."""
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
                raise invalid(field, f"artefact missing from the store: {exc}") from exc
            history.append((record.text, result))
        return encode_messages(tokenizer, build_messages(req.prompt, history))

    def _stored(self, req: GenerateRequest, item: GenerateItem) -> CompletionRecord | None:
        """The record an earlier attempt of this activity already stored, if any (blocking)."""
        key = keys.turn_key(req.run_id, req.task_id, item.sample, req.turn, COMPLETION)
        try:
            return self.store.get_model(key, CompletionRecord)
        except ObjectNotFound:
            return None

    def _write(
        self, req: GenerateRequest, item: GenerateItem, record: CompletionRecord | None
    ) -> Completion:
        """Store completion.json and code.py of one sample, create-only (blocking).

        If another attempt stored a different completion first, that one wins and is returned:
        a ref always matches the bytes under its key, whatever attempts overlap.
        """
        assert record is not None

        def key(name: str) -> str:
            return keys.turn_key(req.run_id, req.task_id, item.sample, req.turn, name)

        try:
            completion_ref = self.store.put_json(key(COMPLETION), record, create_only=True)
        except ObjectExists:
            record = self.store.get_model(key(COMPLETION), CompletionRecord)
            completion_ref = self.store.put_json(key(COMPLETION), record, create_only=True)
        code_ref = self.store.put_text(key(CODE), extract_code(record.text), create_only=True)
        return Completion(
            sample=item.sample,
            completion=completion_ref,
            code=code_ref,
            num_tokens=len(record.completion_token_ids),
            finish_reason=record.finish_reason,
        )

    async def close(self) -> None:
        await self.batcher.close()
        await self.backend.close()
