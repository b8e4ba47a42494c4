"""The inference backend Protocol and the values every backend shares.

A backend turns prompt token ids into sampled completions under one policy version:

    outputs = await backend.generate(prompt_ids, params, policy)

Token ids in, token ids out: prompts are rendered and tokenized once by
`infra.inference.prompts`, so the ids the learner trains on are exactly the ids that were fed.
Each output carries, per sampled token, its log-prob at the row's temperature
(`SamplingParams.logprob_temperature`: `log_softmax(logits / T)`, 1 for a greedy row), which the
learner recomputes for the GRPO ratio (top-p left out; the `vllm` backend, which cannot leave it
out, refuses a sampled row with top_p < 1).

Backends: `local` (transformers, `infra.inference.local`), `vllm` (a vLLM engine in the worker,
`infra.inference.vllm`). Both batch continuously: they take concurrent calls, and the rows of a
new call join the running batch between decode steps. The rules they share live here:
`row_budget` (what a row may sample), `one_line` (an error in a message: the engines' and the
tool-call parser's) and `synthetic_prompts` (the rows of warm-ups and benchmarks).

`PolicyResolver` turns "run R, version N or newest" into a `PolicyHandle` with the version's
files on local disk (`infra.policy_cache.fetch_policy`). A version is either full weights or a
LoRA adapter (`PolicyVersion.adapter_of`) whose handle carries the full-weight version it
applies to (`handle.base`). A request pinned to a version that is not published yet waits for
it, polling `latest.json`, for at most `wait_s`; a version older than the newest that has no
manifest was never published, or was deleted by retention (`infra.retention`), and fails at
once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from contracts.learner import PolicyManifest
from contracts.task import SamplingParams
from infra.policy import MANIFEST, latest_policy
from infra.policy_cache import fetch_policy, pin, unpin
from infra.settings import InferenceSettings
from infra.storage import ObjectNotFound, ObjectStore
from infra.telemetry import span

FinishReason = Literal["stop", "length"]


class InferenceError(Exception):
    """The inference platform failed (server down, out of memory, policy not served).

    `retryable=False` marks a request the backend will never accept (e.g. a malformed one).
    """

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class PolicyHandle:
    """One published policy version, resolved to a local directory: an HF causal LM (config,
    tokenizer, weights), or for a LoRA version a PEFT adapter (adapter_config.json,
    adapter_model.safetensors, tokenizer) over the full-weight version `base`.
    """

    run_id: str
    version: int
    path: Path
    base: PolicyHandle | None = None
    """The full-weight version a LoRA version's adapter applies to; None for full weights."""

    @property
    def name(self) -> str:
        """`<run>/v<version>`: how logs and engines call the version."""
        return f"{self.run_id}/v{self.version}"

    @property
    def weights(self) -> PolicyHandle:
        """The full-weight version that serves this one: itself, or its adapter's base."""
        return self.base or self

    def on_disk(self) -> bool:
        """Whether its directories are still cached (the cache evicts old versions)."""
        return (self.path / MANIFEST).is_file() and (self.base is None or self.base.on_disk())


def model_positions(model_dir: Path | str) -> int:
    """The most tokens a row of the model in `model_dir` may hold: its config's
    `max_position_embeddings` (unbounded where it names none)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 1 << 30)


@dataclass
class GenerationOutput:
    """One sampled completion: the new tokens only, with the policy's log-prob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


def row_budget(prompt: list[int], params: SamplingParams, context: int) -> int:
    """The tokens a row may sample: `max_new_tokens`, clamped to the room its prompt leaves in
    the `context` (the most tokens a row may hold). 0, for an empty prompt (nothing to condition
    on) or a full context, means the row samples nothing: its output is empty, `length`."""
    if not prompt:
        return 0
    return max(0, min(params.max_new_tokens, context - len(prompt)))


def one_line(exc: BaseException) -> str:
    """`exc` as its type and the first line of its message (engines raise pages)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def synthetic_prompts(rows: int, tokens: int, vocab: int) -> list[list[int]]:
    """`rows` distinct prompts of `tokens` ids below `vocab`, the same on every call: what a
    warm-up or a benchmark decodes when no real prompt matters (no tokenizer needed)."""
    return [[(97 + 31 * i + 7 * k) % vocab for k in range(tokens)] for i in range(rows)]


@runtime_checkable
class InferenceBackend(Protocol):
    """Samples completions; one instance serves many concurrent `generate` calls, whose rows
    join one running batch inside it (continuous batching)."""

    name: str
    max_model_len: int | None
    """The most tokens a row may hold (prompt and completion) where the engine bounds it below
    the model's positions (vLLM's `max_model_len`); None: the model's positions."""

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        """One completion per prompt, sampled with the params of the same index, under `policy`."""
        ...

    async def close(self) -> None:
        """Release models, sessions, threads."""
        ...


class PolicyResolver:
    """Resolves `(run, version | None)` to a `PolicyHandle` whose directory is on local disk.

    `None` means the newest published version: `latest.json` is re-read at most every
    `latest_ttl_s` seconds per run, so a new version is picked up within that delay. Each
    version is downloaded once (concurrent resolvers share the download); a specific version is
    always exactly that version, and one not published yet is waited for (at most `wait_s`,
    default `settings.inference.policy_wait_s`). Store calls run in threads.

    A handle's directories (its base's too) stay cached until the task that called `resolve`
    ends: a request reads them after resolving (tokenizer, config, weights, adapters), and
    each activity runs in a task of its own. Each resolve pins them (`infra.policy_cache.pin`,
    which other processes' evictions respect too) and marks them used, so the bounded cache
    evicts the versions least recently asked for, never one a request is still reading.
    """

    PIN_ATTEMPTS = 3
    """Fetches of a version `resolve` tries while each is evicted again before it is pinned."""

    def __init__(
        self,
        store: ObjectStore,
        cache_dir: Path,
        latest_ttl_s: float = 2.0,
        bootstrap: Callable[[str], int] | None = None,
        wait_s: float | None = None,
        keep: int | None = None,
    ):
        """`bootstrap(run_id)` publishes a version 0 for a run that has none (else an error);
        `keep` bounds the cache's versions (`infra.policy_cache.fetch_policy`)."""
        self.store = store
        self.bootstrap = bootstrap
        self.cache_dir = Path(cache_dir)
        self.keep = keep
        self.latest_ttl_s = latest_ttl_s
        self.wait_s = InferenceSettings().policy_wait_s if wait_s is None else wait_s
        self._latest: dict[str, tuple[int, float]] = {}
        self._handles: dict[tuple[str, int], PolicyHandle] = {}
        self._locks: dict[object, asyncio.Lock] = {}
        self._pins: dict[asyncio.Task[Any], dict[Path, int]] = {}

    def _lock(self, key: object) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def resolve(self, run_id: str, version: int | None = None) -> PolicyHandle:
        if version is None:
            version = await self.latest_version(run_id)
        key = (run_id, version)
        # the bound runs from the request, not from when it takes the version's lock: the k-th
        # of k requests waiting for an unpublished version waited k times it
        deadline = time.monotonic() + self.wait_s
        for _ in range(self.PIN_ATTEMPTS):
            handle = self._handles.get(key)
            if handle is None or not handle.on_disk():
                async with self._lock(key):
                    handle = self._handles.get(key)
                    if handle is None or not handle.on_disk():
                        handle = await self._handle(run_id, version, deadline)
                        self._handles[key] = handle
            if self._pin(handle):
                return handle
            if self._handles.get(key) is handle:  # evicted since it was checked: fetch again
                del self._handles[key]
        raise InferenceError(
            f"policy {run_id}/v{version} was evicted from the cache each time before it could "
            f"be pinned ({self.PIN_ATTEMPTS} fetches): the cache keeps too few versions"
        )

    def _pin(self, handle: PolicyHandle) -> bool:
        """Pin the handle's directories until the current task ends (False: one was evicted)."""
        task = asyncio.current_task()
        if task is None:  # a coroutine that asyncio runs is always in a task
            raise RuntimeError("PolicyResolver.resolve runs in an asyncio task")
        held = self._pins.get(task)
        if held is None:
            held = self._pins[task] = {}
            task.add_done_callback(self._unpin)
        for part in (handle, handle.base):
            if part is not None and part.path not in held:
                fd = pin(part.path)
                if fd is None:
                    return False
                held[part.path] = fd
        return True

    def _unpin(self, task: asyncio.Task[Any]) -> None:
        for fd in self._pins.pop(task, {}).values():
            unpin(fd)

    async def latest_version(self, run_id: str) -> int:
        """Newest published version of `run_id` (cached for `latest_ttl_s`)."""
        cached = self._latest.get(run_id)
        if cached is not None and time.monotonic() - cached[1] < self.latest_ttl_s:
            return cached[0]
        async with self._lock(run_id):
            cached = self._latest.get(run_id)
            if cached is not None and time.monotonic() - cached[1] < self.latest_ttl_s:
                return cached[0]
            policy = await asyncio.to_thread(latest_policy, self.store, run_id)
            if policy is not None:
                version = policy.version
            elif self.bootstrap is not None:
                version = await asyncio.to_thread(self.bootstrap, run_id)
            else:
                raise InferenceError(f"run {run_id!r} has no published policy yet (prepare_run)")
            self._latest[run_id] = (version, time.monotonic())
            return version

    async def _handle(self, run_id: str, version: int, deadline: float) -> PolicyHandle:
        with span("policy.fetch", run_id=run_id, policy_version=version):  # waits included
            path = await self._fetch(run_id, version, deadline)
        manifest = PolicyManifest.model_validate_json((path / MANIFEST).read_bytes())
        base_version = manifest.policy.adapter_of
        if base_version is None:
            return PolicyHandle(run_id, version, path)
        base = await self.resolve(run_id, base_version)
        if base.base is not None:
            raise InferenceError(
                f"policy {run_id}/v{version} is an adapter over v{base_version}, itself an "
                "adapter: adapter_of must name a full-weight version",
                retryable=False,
            )
        return PolicyHandle(run_id, version, path, base)

    async def _fetch(self, run_id: str, version: int, deadline: float) -> Path:
        """The version's directory; waits (until `deadline`, `time.monotonic()`'s) while it is
        not published yet."""
        newest: int | None = None
        while True:
            try:
                return await asyncio.to_thread(
                    fetch_policy, self.store, run_id, version, self.cache_dir, self.keep
                )
            except ObjectNotFound:
                if newest is not None and newest >= version:  # checked again after latest moved
                    raise InferenceError(  # the store keeps no trace to tell the two apart
                        f"policy_version {version} of run {run_id!r} was never published "
                        f"(the newest is v{newest}), or has been deleted by retention "
                        "(the run's keep_versions, or tempered runs prune)",
                        retryable=False,
                    ) from None
            latest = await asyncio.to_thread(latest_policy, self.store, run_id)
            newest = None if latest is None else latest.version
            if newest is not None and newest >= version:
                continue  # published meanwhile, or skipped: the next fetch tells
            if time.monotonic() >= deadline:
                raise InferenceError(
                    f"policy_version {version} of run {run_id!r} was not published within "
                    f"{self.wait_s:.0f}s (newest: {'none' if newest is None else f'v{newest}'})",
                    retryable=False,
                )
            await asyncio.sleep(min(self.latest_ttl_s, max(deadline - time.monotonic(), 0.0)))
