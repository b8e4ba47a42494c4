"""The `generate` activity (queue `inference`): one step of the active episodes of one task.

Token in, token out. For every item (episode) it builds the prompt ids with the policy's
`ChatFormat` (infra/inference/prompts.py): at step 0 the chat template's rendering of the system
prompt and the task (with the tools for `workspace`); at step k > 0 exactly the previous step's
prompt and completion ids (its stored `CompletionRecord`, `item.previous`) followed by the
observation's tokens (`item.observation`), never a re-tokenisation of the history. An item whose
prompt plus `max_new_tokens` exceeds `max_context_tokens` is not sampled: it is reported in
`over_budget` and the workflow ends that episode (`context_budget`).

The rest are submitted to the worker's shared `Batcher`, which hands each row straight to the
backend, where rows from every concurrently running activity join one running batch (continuous
batching); a row that fails ends the attempt's other rows there (the attempt is retried whole).
A row whose sampled token's log-prob is not finite is drawn again or fails for good
(`infra.inference.nonfinite.draw_finite`: a greedy or seeded row at once, as InvalidInput).
Each completion is written to `keys.turn_key(run, task, sample, step, "completion.json")` (a
`CompletionRecord`: the exact prompt and completion ids and log-probs the learner trains on),
and its action is parsed: `code` writes the program to `code.py`; `workspace` returns the
`ToolCall` (infra/inference/toolcalls.py, which never raises: a malformed call comes back with
`error` set and costs the episode a step; one whose turn ended at `max_new_tokens` before the
call was whole says so; a call drafted in a think block its prompt opened is none), as its
brief (`ToolCall.brief`): the whole call stays in the record, whose text `env_step` and
`write_trajectories` parse again, so no file content the model writes crosses Temporal. A
`workspace` prompt also tells the episode its turns, where the request gives them (`_turns`),
and which calls of its previous turn were not run (`ChatFormat`).

Policy: `req.policy_version` None means the newest published version of `req.policy_run`
(re-read every couple of seconds, so a hot reload needs no restart); a number means exactly
that version. Seeds: with `sampling.seed = s`, each row samples from a stream of its own, seeded
by a hash of (s, task, sample, step): a seeded run is reproducible, and no two of its rows share
their sampling noise (before, sample i of step t of every task used `s + 1000 * i + t`).

Retries: step artefacts are written create-only. An attempt first reads what earlier attempts
stored for its samples, reuses those records (after checking they answer the same prompt),
samples the rest from the same policy version, and never overwrites: if an overlapping attempt
stores a sample first, that record wins. A returned ref therefore always matches its bytes.

Errors: storage and inference infrastructure failures are retryable; a request that can never
succeed (no items, duplicate samples, a step k > 0 without its previous record or observation,
an artefact missing, not matching its digest or not a valid record (`activities/stored.py`), an
observation that is not one of its environment's, an unpublished pinned version, a policy whose
chat template cannot render the step (`prompts.ChatTemplateError`: Gemma's refuses a system
message) or that the backend cannot load) raises a non-retryable ApplicationError naming it.
Served by `tempered worker inference`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.stored import parse_model, read_model, read_verified
from contracts.common import describe_validation_error
from contracts.episode import WORKSPACE_TOOLS
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity
from contracts.rollout import (
    Completion,
    CompletionRecord,
    GenerateItem,
    GenerateRequest,
    GenerateResponse,
)
from contracts.task import EnvName, SamplingParams
from infra import keys
from infra.aio import all_or_cancel
from infra.inference import (
    Batcher,
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
    get_backend,
    model_positions,
)
from infra.inference.calltags import starts_thinking
from infra.inference.nonfinite import draw_finite
from infra.inference.prompts import (
    ChatFormat,
    ChatTemplateError,
    extract_code,
    observation_text,
)
from infra.inference.toolcalls import parse_tool_call
from infra.settings import Settings
from infra.storage import ObjectExists, ObjectNotFound, ObjectStore, ref_of

COMPLETION = "completion.json"
CODE = "code.py"
MAX_FORMATS = 4


def _version(req: GenerateRequest, stored: list[CompletionRecord | None]) -> int | None:
    """The version to sample: the request's, or the one an earlier attempt already used."""
    earlier = {record.policy_version for record in stored if record is not None}
    if not earlier:
        return req.policy_version
    version = min(earlier)
    if req.policy_version is not None and earlier != {req.policy_version}:
        raise invalid("policy_version", f"turn already stored from version(s) {sorted(earlier)}")
    return version


@contextmanager
def _template_of(policy: PolicyHandle) -> Iterator[None]:
    """`policy`'s chat template failing to render a step (`ChatTemplateError`) as the
    non-retryable InferenceError it is: every attempt renders the same messages alike."""
    try:
        yield
    except ChatTemplateError as exc:
        raise InferenceError(f"policy {policy.name}: {exc}", retryable=False) from exc


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def sample_params(sampling: SamplingParams, task_id: str, sample: int, turn: int) -> SamplingParams:
    """The params of one row: the request's, with the row's own seed if seeded (a hash of the
    base seed, the task, the sample and the turn: the same on every machine and every run)."""
    if sampling.seed is None:
        return sampling
    row = f"{sampling.seed}/{task_id}/{sample}/{turn}".encode()
    seed = int.from_bytes(hashlib.blake2b(row, digest_size=8).digest(), "big") >> 1
    return sampling.model_copy(update={"seed": seed})


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
        self.batcher = Batcher(self.backend)
        self.policies = PolicyResolver(
            self.store,
            settings.policy_cache,
            bootstrap=self._publish_base_model,
            keep=settings.s3.policy_cache_versions,
        )
        self._formats: OrderedDict[tuple[Path, EnvName], ChatFormat] = OrderedDict()
        self._formats_lock = asyncio.Lock()
        self._positions: dict[Path, int] = {}

    def _publish_base_model(self, run_id: str) -> int:
        """Version 0 of a run started without a training run: `settings.inference.base_model`."""
        from infra.base_models import materialize_base_model
        from infra.policy import publish_policy

        local_dir = materialize_base_model(
            self.settings.inference.base_model, self.settings, self.store
        )
        return publish_policy(self.store, run_id, 0, local_dir).version

    @activity.defn(name=Activity.GENERATE)
    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        self._validate(req)
        try:  # heartbeats flow through downloads, model loads and queueing alike
            return await heartbeating(self._generate(req))
        except InferenceError as exc:
            kind = ErrorType.INFERENCE if exc.retryable else ErrorType.INVALID_INPUT
            raise fail(kind, str(exc)) from exc

    async def _generate(self, req: GenerateRequest) -> GenerateResponse:
        stored = await asyncio.gather(
            *(asyncio.to_thread(self._stored, req, index) for index in range(len(req.items)))
        )
        policy = await self.policies.resolve(req.policy_run, _version(req, stored))
        chat = await self.chat_format(policy, req.env)
        with _template_of(policy):
            prompts = await asyncio.gather(
                *(
                    asyncio.to_thread(self._prompt_ids, chat, req, index, item)
                    for index, item in enumerate(req.items)
                )
            )
        for index, (record, prompt) in enumerate(zip(stored, prompts, strict=True)):
            if record is not None and record.prompt_token_ids != prompt:
                raise invalid(f"items[{index}]", "turn already stored for another prompt")
        limit = min(req.max_context_tokens, await self.context_limit(policy))
        budget = limit - req.sampling.max_new_tokens
        over = {i for i, prompt in enumerate(prompts) if len(prompt) > budget}
        todo = [i for i, record in enumerate(stored) if record is None and i not in over]
        started_at = _now()
        results = await all_or_cancel(  # a row that fails ends the others: nobody awaits them
            draw_finite(
                self.batcher,
                prompts[i],
                sample_params(req.sampling, req.task_id, req.items[i].sample, req.turn),
                policy,
                row=f"items[{i}] (sample {req.items[i].sample}, step {req.turn})",
            )
            for i in todo
        )
        finished_at = _now()
        records = dict(enumerate(stored))
        guided = req.sampling.tool_choice == "required"
        for i, result in zip(todo, results, strict=True):
            records[i] = CompletionRecord(
                text=chat.tokenizer.decode(result.output.token_ids, skip_special_tokens=True),
                prompt_token_ids=prompts[i],
                completion_token_ids=result.output.token_ids,
                logprobs=result.output.logprobs,
                logprob_temperature=req.sampling.logprob_temperature,
                policy_version=policy.version,
                finish_reason=result.output.finish_reason,
                started_at=started_at,
                finished_at=finished_at,
                thinking=starts_thinking(prompts[i], chat.tokenizer.decode, guided=guided),
            )
        completions = await asyncio.gather(
            *(
                asyncio.to_thread(self._write, req, item, records[i])
                for i, item in enumerate(req.items)
                if i not in over
            )
        )
        tokens = sum(len(r.output.token_ids) for r in results)
        weighted = sum(len(r.output.token_ids) * r.batch_tokens_per_s for r in results)
        return GenerateResponse(
            policy_version=policy.version,
            completions=list(completions),
            over_budget={req.items[i].sample: len(prompts[i]) for i in sorted(over)},
            tokens_per_s=round(weighted / tokens, 2) if tokens else 0.0,
        )

    @staticmethod
    def _validate(req: GenerateRequest) -> None:
        if not req.items:
            raise invalid("items", "no samples to generate for")
        samples = [item.sample for item in req.items]
        if len(set(samples)) != len(samples):
            raise invalid("items", f"duplicate sample indices {samples}")
        if req.sampling.tool_choice == "required" and req.env is not EnvName.WORKSPACE:
            raise invalid("sampling.tool_choice", f"'required' needs tools; {req.env} has none")
        for i, item in enumerate(req.items):
            if req.turn == 0 and (item.previous or item.observation):
                raise invalid(f"items[{i}]", "step 0 has no previous step")
            if req.turn > 0 and (item.previous is None or item.observation is None):
                raise invalid(
                    f"items[{i}]", f"step {req.turn} needs the previous completion and observation"
                )

    async def chat_format(self, policy: PolicyHandle, env: EnvName) -> ChatFormat:
        """The policy's chat format for `env` (a few are kept, sharing the policy's tokenizer)."""
        key = (policy.path, env)
        if key not in self._formats:
            # one load however many activities ask at once: a run's first wave is 64 of them,
            # and each loading the tokenizer kept a fresh run's first decode waiting 40 s
            async with self._formats_lock:
                if key not in self._formats:
                    self._formats[key] = await self._new_chat_format(policy, env)
                while len(self._formats) > MAX_FORMATS:
                    self._formats.popitem(last=False)
        self._formats.move_to_end(key)
        return self._formats[key]

    async def context_limit(self, policy: PolicyHandle) -> int:
        """The most tokens a row of `policy` may hold here: the model's positions, or the
        engine's bound below them. A prompt past it less the completion's budget ends its
        episode as `context_budget` (the engine cut it silently, or returned nothing)."""
        path = policy.weights.path
        if path not in self._positions:
            self._positions[path] = await asyncio.to_thread(model_positions, path)
        return min(self._positions[path], self.backend.max_model_len or self._positions[path])

    async def _new_chat_format(self, policy: PolicyHandle, env: EnvName) -> ChatFormat:
        from transformers import AutoTokenizer  # seconds to import: only inference pays

        loaded = [f for (path, _), f in self._formats.items() if path == policy.path]
        if loaded:
            tokenizer = loaded[0].tokenizer
        else:
            tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(policy.path))
        with _template_of(policy):
            return ChatFormat(tokenizer, env)

    def _prompt_ids(
        self, chat: ChatFormat, req: GenerateRequest, index: int, item: GenerateItem
    ) -> list[int]:
        """The prompt of one episode's step (blocking: reads the previous step from S3)."""
        if item.previous is None or item.observation is None:
            return chat.first_prompt(req.prompt, req.max_turns)
        where = f"items[{index}]"
        previous = read_model(self.store, f"{where}.previous", item.previous, CompletionRecord)
        observation = read_verified(self.store, f"{where}.observation", item.observation)
        try:
            text = observation_text(req.env, observation)
        except ValidationError as exc:  # `code` reads an execution's result.json
            why = describe_validation_error(exc)
            raise invalid(f"{where}.observation", f"{item.observation.key}: {why}") from exc
        return chat.next_prompt(previous, text, req.turn, req.max_turns)

    def _stored(self, req: GenerateRequest, index: int) -> CompletionRecord | None:
        """The record an earlier attempt of this activity already stored, if any (blocking)."""
        sample = req.items[index].sample
        key = keys.turn_key(req.run_id, req.task_id, sample, req.turn, COMPLETION)
        try:
            data = self.store.get_bytes(key)
        except ObjectNotFound:
            return None
        return parse_model(f"items[{index}]", key, data, CompletionRecord)

    def _write(
        self,
        req: GenerateRequest,
        item: GenerateItem,
        record: CompletionRecord | None,
    ) -> Completion:
        """Store completion.json (and `code`'s code.py) of one sample, create-only (blocking); its
        call is read as its record says (`thinking`: the prompt opened a think block).

        If another attempt stored a different completion first, that one wins and is returned:
        a ref always matches the bytes under its key, whatever attempts overlap.
        """
        assert record is not None

        def key(name: str) -> str:
            return keys.turn_key(req.run_id, req.task_id, item.sample, req.turn, name)

        try:
            completion_ref = self.store.put_json(key(COMPLETION), record, create_only=True)
        except ObjectExists:  # another attempt's record: its bytes give its ref, no write
            data = self.store.get_bytes(key(COMPLETION))
            completion_ref = ref_of(key(COMPLETION), data)
            record = parse_model(
                f"items[sample {item.sample}]", key(COMPLETION), data, CompletionRecord
            )
        action: dict[str, Any] = {}
        if req.env is EnvName.CODE:
            code = extract_code(record.text)
            action["code"] = self.store.put_text(key(CODE), code, create_only=True)
        else:
            # a turn `max_new_tokens` ended: a call not yet whole is told as cut, not as bad JSON
            cut_at = len(record.completion_token_ids) if record.finish_reason == "length" else None
            call = parse_tool_call(
                record.text, WORKSPACE_TOOLS, cut_at=cut_at, thinking=record.thinking
            )
            action["call"] = call.brief()
        return Completion(
            sample=item.sample,
            completion=completion_ref,
            num_tokens=len(record.completion_token_ids),
            prompt_tokens=len(record.prompt_token_ids),
            finish_reason=record.finish_reason,
            policy_version=record.policy_version,
            **action,
        )

    async def close(self) -> None:
        await self.backend.close()
