"""The local backend's decode loop: rows join a running, KV-cached batch between decode steps.

    batch = RowBatch(policy, choose)   # policy: model, pad_id, eos_ids, max_context, stops
    batch.admit([batch.row(prompt, params) for ...])   # prefill, merge the KV into the batch
    while batch.rows:
        for row in batch.step():       # one token for every row; the rows that ended
            ...row.output

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
A row whose future its caller cancelled ends at the next step (its KV is not kept). A guided
row whose sampled token's constrained logit is not finite (its policy computed NaN) ends alone
at that token, its log-prob not finite, for `infra.inference.nonfinite` to judge. `step(done)`
hands the rows that ended to `done` before the step's decode forward, which may fail. A prefill
forward that fails fails its own rows alone (`PrefillFailed`): the running batch goes on.
Prefills fill cache layers that hold every column, a sliding-window model's included (its own
cache would keep the window only; the window is the attention mask's, as in the decode steps).

A `RowBatch` is one thread's: the local backend runs it on the decoder's
(`infra.inference.decoder_thread.Decoder`: the queue of waiting rows, version drains, faults).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers.cache_utils import DynamicCache

from contracts.task import SamplingParams
from infra.inference.base import FinishReason, GenerationOutput, InferenceError, row_budget
from infra.inference.guided import CallGuide, Guides
from infra.inference.kvcache import SlotCache, compaction
from infra.inference.prefixes import Prefix, VersionPrefixes
from infra.inference.stops import RowWatch, StopRules

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


class PrefillFailed(Exception):
    """A prefill forward of `RowBatch.admit` failed (`cause`): its `rows` did not join."""

    def __init__(self, rows: list[Row], cause: Exception):
        super().__init__(f"the prefill of {len(rows)} rows failed: {cause!r}")
        self.rows, self.cause = rows, cause


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
        watch = self.policy.stops.watch(params, prompt)
        guide = self.policy.guides.guide(params)
        return Row(prompt, params, budget, generator, watch, guide)

    @torch.inference_mode()
    def admit(self, rows: list[Row], done: Callable[[list[Row]], None] | None = None) -> list[Row]:
        """Prefill `rows` and add them to the batch; returns those with nothing to sample (a
        budget of 0), handed first to `done`: they are done as they are. A row whose prompt
        extends one that ended in this version (`prefixes`) prefills only its new tokens. A
        prefill forward that fails fails its own rows only: the others join, then
        `PrefillFailed` names them (the running batch is as it was)."""
        empty = [r for r in rows if r.budget <= 0]
        if done is not None and empty:
            done(empty)
        units: list[tuple[list[Row], Callable[[], _Prefilled]]] = []
        fresh: list[Row] = []
        for row in (r for r in rows if r.budget > 0):
            hit = self.prefixes.take(row.prompt) if self.prefixes is not None else None
            if hit is None:
                fresh.append(row)
            else:
                units.append(([row], functools.partial(self._prefill_after, row.prompt, hit)))
        if fresh:
            units.append((fresh, functools.partial(self._prefill, [r.prompt for r in fresh])))
        failed: list[Row] = []
        cause: Exception | None = None
        for group, prefill in units:
            try:
                prefilled = prefill()
            except Exception as exc:  # a forward's fault: nothing of the batch changed yet
                failed, cause = failed + group, cause or exc
                continue
            self._join(*prefilled)
            self.rows.extend(group)
        if cause is not None:
            raise PrefillFailed(failed, cause)
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
            past_key_values=cache if cache is not None else DynamicCache(),  # every column:
            # the model's own cache keeps a sliding-window layer's window only
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
    def step(self, done: Callable[[list[Row]], None] | None = None) -> list[Row]:
        """Sample one token for every row; returns the rows that ended (and leave the batch),
        handed first to `done` as soon as they end: before this step's decode forward, so a
        fault of that forward (which loses the batch) cannot lose them."""
        if not self.rows:
            return []
        assert self._logits is not None
        guided = self._guided_logits()
        tokens = self.choose(
            guided, [r.params for r in self.rows], [r.generator for r in self.rows]
        )
        temperature = [r.params.logprob_temperature for r in self.rows]  # as the learner's
        scaled = self._logits / torch.tensor(temperature, device=self.device)[:, None]
        logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]
        gone: list[int] = []
        for r, (row, token, logprob, allowed) in enumerate(
            zip(
                self.rows,
                tokens.tolist(),
                logprobs.tolist(),
                self._allowed(guided, tokens),
                strict=True,
            )
        ):
            finish = self._finish(row, token, logprob, allowed)
            if finish is not None:
                row.output.finish_reason = finish
                gone.append(r)
        ended = [self.rows[r] for r in gone]
        if done is not None and ended:
            done(ended)
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

    def _allowed(self, guided: torch.Tensor, tokens: torch.Tensor) -> list[bool]:
        """Per row: whether its sampled token was one its guide allowed (its constrained logit
        finite); False for a guided row whose logits are not finite (a policy computing NaN)."""
        chosen = guided.gather(-1, tokens[:, None])[:, 0]
        finite = torch.isfinite(chosen).tolist()
        return [row.guide is None or ok for row, ok in zip(self.rows, finite, strict=True)]

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

    def _finish(
        self, row: Row, token: int, logprob: float, allowed: bool = True
    ) -> FinishReason | None:
        if row.future is not None and row.future.cancelled():
            return "stop"  # nobody waits for it any more: free its place
        row.output.token_ids.append(token)
        if not allowed:  # a guided row whose logits are not finite: it alone ends, its
            # log-prob not finite (NaN if its own was), for `infra.inference.nonfinite`
            row.output.logprobs.append(logprob if not math.isfinite(logprob) else math.nan)
            return "stop"
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
