"""The local backend's decode loop: rows join a running, KV-cached batch between decode steps.

    batch = RowBatch(policy, choose)   # policy: model, pad_id, eos_ids, max_context, stops
    batch.admit([batch.row(prompt, params) for ...])   # prefill, merge the KV into the batch
    while batch.rows:
        for row in batch.step():       # one token for every row; the rows that ended
            ...row.output

    decoder = Decoder(max_rows=64, start=load_and_activate)   # a thread: continuous batching
    output = await asyncio.wrap_future(decoder.submit(key, prompt, params))

`RowBatch` is one transformers model's batch: each admitted row is prefilled with its prompt
(left-padded among the rows admitted with it; rows admitted together with the same prompt, the
samples of one task, share one prefill), and its KV cache joins the running batch's
`infra.inference.kvcache.SlotCache` right-aligned, the shorter side left-padded (the
attention mask hides the padding; every row carries its own position ids). A row that ends
(EOS, a stop rule of `infra.inference.stops`, its token budget, the end of a guided row's call:
`infra.inference.guided`) leaves the batch at once (the last row takes its slot), and columns
that only padding still occupies are trimmed. Given a version's `infra.inference.prefixes`
store, a row that ends leaves its KV there, and a row whose prompt extends it (the episode's
next step) is prefilled from it, its new tokens only. Every row samples from its own generator:
one uniform per step, so a seeded row's tokens do not depend on which rows share its batch.

`Decoder` runs a `RowBatch` on a thread of its own, one policy version at a time. Waiting rows
are taken in order of `SamplingParams.priority` (lower first: a run's evaluations wait behind its
training rollouts), then of arrival; a priority counts for `AGING_S` of waiting, so no row
starves. Rows of the running version join between steps while the first waiting row is of that
version; once it is another version's, the running version stops admitting, finishes its rows
(the drain), and that version starts (its model loaded and, for a LoRA version, its adapter
activated, by `start`, on this thread). A row whose prompt holds an id outside the model's
vocabulary fails alone, not to be retried; any other fault loses the batch: its rows fail, retried.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from contracts.task import SamplingParams
from infra.inference.base import FinishReason, GenerationOutput, InferenceError, row_budget
from infra.inference.guided import CallGuide, Guides
from infra.inference.kvcache import SlotCache, compaction
from infra.inference.prefixes import Prefix, VersionPrefixes
from infra.inference.stops import RowWatch, StopRules

log = logging.getLogger(__name__)
_Prefilled = tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]
"""A prefill's cache, `(rows, width)` mask, next position ids `(rows, 1)`, last logits."""
Choose = Callable[[torch.Tensor, list[SamplingParams], list[torch.Generator]], torch.Tensor]


class BatchPolicy(Protocol):
    """What a batch needs of a loaded policy (`infra.inference.local.LoadedPolicy`)."""

    model: Any
    eos_ids: frozenset[int]
    pad_id: int
    max_context: int
    stops: StopRules
    guides: Guides


@dataclass
class Row:
    """One completion being sampled."""

    prompt: list[int]
    params: SamplingParams
    budget: int
    generator: torch.Generator
    watch: RowWatch | None = None
    guide: CallGuide | None = None
    output: GenerationOutput = field(default_factory=lambda: GenerationOutput([], [], "length"))
    future: Future[GenerationOutput] | None = None


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class RowBatch:
    """The running batch of one model: KV cache, attention mask, next positions, next logits."""

    def __init__(
        self, policy: BatchPolicy, choose: Choose, prefixes: VersionPrefixes | None = None
    ):
        self.policy, self.model, self.choose = policy, policy.model, choose
        self.prefixes = prefixes
        self.pad_id, self.eos_ids = policy.pad_id, policy.eos_ids
        self.device = next(self.model.parameters()).device
        self.vocab = int(self.model.get_input_embeddings().num_embeddings)
        self.rows: list[Row] = []
        self._cache: SlotCache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long)
        self._positions = torch.zeros((0, 1), dtype=torch.long)
        self._logits: torch.Tensor | None = None

    def row(self, prompt: list[int], params: SamplingParams) -> Row:
        """A row of this batch's policy (its budget: `row_budget` in the model's context); a
        prompt with an id the model has no embedding for would fail the batch: refused."""
        if prompt and not (min(prompt) >= 0 and max(prompt) < self.vocab):
            outside = sorted({i for i in prompt if not 0 <= i < self.vocab})[:5]
            message = f"prompt token ids {outside} outside the vocabulary [0, {self.vocab})"
            raise InferenceError(message, retryable=False)
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        budget = row_budget(prompt, params, self.policy.max_context)
        watch, guide = self.policy.stops.watch(params), self.policy.guides.guide(params)
        return Row(prompt, params, budget, generator, watch, guide)

    @torch.inference_mode()
    def admit(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows` and add them to the batch; returns those with nothing to sample
        (a budget of 0), which are done as they are. A row whose prompt extends one that ended in
        this version (`prefixes`) prefills only its new tokens."""
        empty = [r for r in rows if r.budget <= 0]
        rows = [r for r in rows if r.budget > 0]
        fresh: list[Row] = []
        for row in rows:
            hit = self.prefixes.take(row.prompt) if self.prefixes is not None else None
            if hit is None:
                fresh.append(row)
            else:
                self._join(*self._prefill_after(row.prompt, hit))
                self.rows.append(row)
        if fresh:
            self._join(*self._prefill([r.prompt for r in fresh]))
            self.rows.extend(fresh)
        return empty

    def _prefill(self, prompts: list[list[int]]) -> _Prefilled:
        """One left-padded forward over `prompts`; rows with the same prompt (a task's samples)
        are prefilled once, their KV copied."""
        unique: dict[tuple[int, ...], int] = {}
        copies = [unique.setdefault(tuple(prompt), len(unique)) for prompt in prompts]
        width = max(len(prompt) for prompt in unique)
        ids = torch.full((len(unique), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for i, prompt in enumerate(unique):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(ids, mask, positions)
        if len(unique) < len(prompts):
            index = torch.tensor(copies, device=self.device)
            out.past_key_values.batch_select_indices(index)
            out.logits, mask, positions = out.logits[index], mask[index], positions[index]
        return out.past_key_values, mask, positions[:, -1:] + 1, out.logits[:, -1, :].float()

    def _prefill_after(self, prompt: list[int], hit: Prefix) -> _Prefilled:
        """One row's forward over the tokens of `prompt` after its stored prefix `hit`."""
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for layer, (keys, values) in enumerate(hit.layers):
            cache.update(keys.to(self.device), values.to(self.device), layer)
        ids = torch.tensor([prompt[hit.length :]], device=self.device)
        positions = torch.arange(hit.length, len(prompt), device=self.device)[None]
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=self.device)
        out = self._forward(ids, mask, positions, cache)
        return out.past_key_values, mask, positions[:, -1:] + 1, out.logits[:, -1, :].float()

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any = None
    ) -> Any:
        """A prefill forward (after `cache`'s tokens, if given): the KV and the last logits."""
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )

    def _join(
        self, cache: Any, mask: torch.Tensor, nexts: torch.Tensor, logits: torch.Tensor
    ) -> None:
        """Add prefilled rows (their KV, `(rows, width)` mask, next positions, last logits)."""
        if self._cache is None:
            self._cache = SlotCache(len(cache.layers))
            self._mask, self._logits, self._positions = mask, logits, nexts
        else:
            assert self._logits is not None
            length = max(self._mask.shape[1], mask.shape[1])
            self._mask = torch.cat([_pad_left(self._mask, length, 1), _pad_left(mask, length, 1)])
            self._positions = torch.cat([self._positions, nexts])
            self._logits = torch.cat([self._logits, logits])
        self._cache.admit(cache, mask)

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """Sample one token for every row; returns the rows that ended (and leave the batch)."""
        if not self.rows:
            return []
        assert self._logits is not None
        tokens = self.choose(
            self._guided_logits(), [r.params for r in self.rows], [r.generator for r in self.rows]
        )
        temperature = [r.params.logprob_temperature for r in self.rows]  # as the learner's
        scaled = self._logits / torch.tensor(temperature, device=self.device)[:, None]
        logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]
        gone: list[int] = []
        for r, (row, token, logprob) in enumerate(
            zip(self.rows, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            finish = self._finish(row, token, logprob)
            if finish is not None:
                row.output.finish_reason = finish
                gone.append(r)
        ended = [self.rows[r] for r in gone]
        self._keep_prefixes(gone)
        if len(gone) == len(self.rows):
            self.rows, self._cache, self._logits = [], None, None
            return ended
        assert self._cache is not None
        if gone:
            order = compaction(len(self.rows), gone)
            index = torch.tensor(order, device=self.device)
            self._cache.batch_select_indices(index)
            tokens, self._mask = tokens[index], self._mask[index]
            self._positions = self._positions[index]
            self.rows = [self.rows[r] for r in order]
            self._trim()
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=-1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self._mask,
            position_ids=self._positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._logits = out.logits[:, -1, :].float()
        self._positions = self._positions + 1
        return ended

    def _guided_logits(self) -> torch.Tensor:
        """The next logits with each guided row's disallowed tokens at -inf (a copy; the
        log-probs recorded are the policy's own, from the unguided logits)."""
        assert self._logits is not None
        guided = [(r, row.guide) for r, row in enumerate(self.rows) if row.guide is not None]
        logits = self._logits.clone() if guided else self._logits
        for r, guide in guided:
            guide.constrain(logits[r])
        return logits

    def _keep_prefixes(self, gone: list[int]) -> None:
        """Store the KV of rows that ended (all their tokens but the last, which no forward
        read) for the prompt of their episode's next step."""
        if self.prefixes is None or self._cache is None:
            return
        for r in gone:
            row = self.rows[r]
            if row.future is not None and row.future.cancelled():
                continue
            tokens = row.prompt + row.output.token_ids[:-1]
            self.prefixes.put(tokens, self._cache.row(r, len(tokens)))

    def _finish(self, row: Row, token: int, logprob: float) -> FinishReason | None:
        if row.future is not None and row.future.cancelled():
            return "stop"  # nobody waits for it any more: free its place
        row.output.token_ids.append(token)
        row.output.logprobs.append(logprob)
        stopped = row.watch is not None and row.watch.add(token)
        called = row.guide is not None and row.guide.add(token)
        if token in self.eos_ids or stopped or called:
            return "stop"
        return "length" if len(row.output.token_ids) >= row.budget else None

    def _trim(self) -> None:
        """Drop leading columns that are padding in every row (left by rows that ended)."""
        used = self._mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start > 0 and self._cache is not None:
            self._mask = self._mask[:, start:]
            self._cache.trim(start)


Start = Callable[[Hashable], RowBatch]
"""Makes the batch of a policy version: loads its model, activates its adapter."""
AGING_S = 300.0
"""How long a waiting row's priority counts; after it, the row waits by arrival alone."""


@dataclass(eq=False)
class _Waiting:
    key: Hashable
    prompt: list[int]
    params: SamplingParams
    future: Future[GenerationOutput]
    since: float = field(default_factory=time.monotonic)

    def rank(self, now: float) -> int:
        return self.params.priority if now - self.since < AGING_S else 0


class Decoder:
    """Continuous batching on a thread: `submit` rows of any version; one version decodes at a
    time, the others wait for its drain."""

    def __init__(self, max_rows: int, start: Start):
        self.max_rows, self._start = max_rows, start
        self._queue: deque[_Waiting] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="decoder", daemon=True)
        self._thread.start()

    def submit(
        self, key: Hashable, prompt: list[int], params: SamplingParams
    ) -> Future[GenerationOutput]:
        future: Future[GenerationOutput] = Future()
        with self._changed:
            if self._closed:
                raise InferenceError("the local backend is closed", retryable=False)
            self._queue.append(_Waiting(key, prompt, params, future))
            self._changed.notify()
        return future

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=60)

    def _take(self, key: Hashable | None, room: int) -> tuple[Hashable | None, list[_Waiting]]:
        """Requests to admit, first in (priority, arrival) order: of the running version (`key`)
        while the first waiting row is of it, else none (the batch drains); with no batch
        running, of the first waiting row's version (none: nothing to start)."""
        with self._changed:
            while not self._closed and not self._queue and key is None:
                self._changed.wait()
            now = time.monotonic()  # a row its caller gave up on neither drains nor starts
            self._queue = deque(item for item in self._queue if not item.future.cancelled())
            ordered = sorted(self._queue, key=lambda item: item.rank(now))  # stable: arrival
            if not ordered:
                return key, []
            if key is None:
                key = ordered[0].key
            elif ordered[0].key != key:
                return key, []  # drain first
            taken = [item for item in ordered if item.key == key][:room]
            self._queue = deque(item for item in self._queue if item not in taken)
            return key, taken

    def _run(self) -> None:
        key: Hashable | None = None
        batch: RowBatch | None = None
        while not self._closed:
            running = batch is not None and bool(batch.rows)
            room = self.max_rows - (len(batch.rows) if batch is not None else 0)
            key, items = self._take(key if running else None, room)
            if key is None:
                continue
            rows: list[Row] = []
            try:
                if batch is None or not batch.rows:
                    batch = self._start(key)
                for item in items:
                    try:
                        rows.append(batch.row(item.prompt, item.params))
                    except InferenceError as exc:  # the row's own input: it alone fails
                        _fail([item.future], exc)
                        continue
                    rows[-1].future = item.future
                self._resolve(batch.admit(rows))
                self._resolve(batch.step())
            except Exception as exc:  # an engine fault: the batch is lost, every row of it fails
                log.warning("decode batch of %s failed: %r", key, exc)
                error = exc if isinstance(exc, InferenceError) else InferenceError(repr(exc))
                _fail([*_futures(batch), *(item.future for item in items)], error)
                batch = None
        with self._changed:
            waiting = [item.future for item in self._queue]
        _fail([*waiting, *_futures(batch)], InferenceError("the local backend closed"))

    def _resolve(self, rows: list[Row]) -> None:
        for row in rows:
            if row.future is not None:
                with contextlib.suppress(InvalidStateError):  # its caller gave up on it
                    row.future.set_result(row.output)


def _futures(batch: RowBatch | None) -> list[Future[GenerationOutput]]:
    return [r.future for r in (batch.rows if batch else []) if r.future is not None]


def _fail(futures: list[Future[GenerationOutput]], error: Exception) -> None:
    for future in futures:
        with contextlib.suppress(InvalidStateError):  # done, or its caller gave up on it
            future.set_exception(error)
