"""Local inference backend: transformers in the worker process (CPU by default), with
continuous batching.

    backend = LocalBackend(settings.inference.local)     # device, threads, max_loaded, max_rows
    outputs = await backend.generate(prompt_ids, params, policy)

The decode loop is `infra.inference.decoder` rather than `model.generate`, because every row
has its own sampling params (temperature, top-p, max_new_tokens, seed, stop rules) and rows join
the running batch between decode steps: a request that arrives while others decode is
prefilled and merged into their KV cache, and a row leaves as soon as it ends (EOS, its token
budget, the end of its first code block or tool call). Each row draws from its own
`torch.Generator`, so a seeded row samples the same tokens whatever else shares its batch.
Temperature 0 is greedy (argmax). `sample_batch` runs the same loop on a fixed set of rows.

Log-probs: for each sampled token we store `log_softmax(logits / T)[token]` at the row's
`SamplingParams.logprob_temperature` T (its temperature; 1 when greedy), which the learner
recomputes for its importance ratio; top-p is left out of it, as the learner leaves it out.

One policy version decodes at a time; requests for another wait until the running rows finish.
A call's row that fails (a prompt outside the vocabulary) cancels its other rows
(`infra.aio.all_or_cancel`), which leave the batch at its next step.
At most `max_loaded` full-weight versions (default 2) stay loaded, the least recently used
evicted first; a batch keeps a reference to its model, so evicting a version never disturbs a
batch that is still running on it. A LoRA version (`PolicyHandle.base`) is its base's model with
the version's adapter applied (peft); serving it uses its base.

A version that cannot be loaded fails its rows with an InferenceError (`_load_error`): retried
where a file may yet come right (missing, unreadable: the cache evicted it), not where the
loader refuses files that are all there (an unknown model_type or architecture, an adapter
aimed at modules the model lacks), which it refuses on every attempt.

Throughput on this machine:  python -m infra.inference.local smollm2 --batch 1 8 32
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from contracts.episode import WORKSPACE_TOOLS
from contracts.learner import PolicyManifest
from contracts.task import SamplingParams
from infra.aio import all_or_cancel
from infra.inference.base import (
    GenerationOutput,
    InferenceError,
    PolicyHandle,
    model_positions,
    one_line,
    synthetic_prompts,
)
from infra.inference.decoder import RowBatch
from infra.inference.decoder_thread import Decoder
from infra.inference.guided import Guides
from infra.inference.kvcache import ATTENTION, register_attention
from infra.inference.prefixes import PrefixStore
from infra.inference.stops import StopRules
from infra.policy import MANIFEST
from infra.settings import LocalInferenceSettings

log = logging.getLogger(__name__)


@dataclass
class LoadedPolicy:
    """A policy's model with what the decode loop needs to know about it."""

    model: Any
    eos_ids: frozenset[int]
    pad_id: int
    max_context: int
    stops: StopRules
    """Where `stop_after_code_block` and `stop_after_tool_call` end a row (its tokenizer's)."""
    guides: Guides
    """The grammar of rows with `tool_choice = "required"` (built on the first such row)."""
    adapter: str | None = None
    """A LoRA version: the name of its adapter in `model` (a peft model over its base)."""
    base: tuple[str, int] | None = None
    """A LoRA version: (run, version) of its base."""


def load_policy(path: str, device: torch.device) -> LoadedPolicy:
    """Load an HF causal-LM directory in float32, in eval mode, on `device`."""
    from transformers import AutoModelForCausalLM

    register_attention()
    model: Any = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=ATTENTION
    )
    model = model.to(device).eval()
    config, gen_config = model.config, model.generation_config
    eos: set[int] = set()
    for source in (gen_config.eos_token_id, config.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif source:
            eos.update(int(t) for t in source)
    pad = gen_config.pad_token_id if gen_config.pad_token_id is not None else config.pad_token_id
    if pad is None:
        pad = min(eos) if eos else 0
    max_context = model_positions(path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    stops, guides = StopRules.of(tokenizer), Guides(tokenizer, WORKSPACE_TOOLS, config.vocab_size)
    return LoadedPolicy(model, frozenset(eos), int(pad), max_context, stops=stops, guides=guides)


NUCLEUS_K = 256
"""Top-p first looks for the nucleus among the k most likely tokens (a full sort of a 49k
vocabulary per row per step costs more than the model forward on CPU); rows whose nucleus is
larger fall back to sorting."""


def _nucleus_sample(
    probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Inverse-CDF sample of each row from its top-p nucleus, given one uniform in [0, 1) per row.

    The nucleus is the smallest set of most likely tokens whose mass reaches `top_p`; a row
    with top_p = 1 samples the whole distribution without sorting.
    """
    rows, vocab = probs.shape
    tokens = torch.empty(rows, dtype=torch.long, device=probs.device)
    whole = top_p >= 1.0
    if whole.any():
        cdf = probs[whole].cumsum(-1)
        pick = torch.searchsorted(cdf, (uniforms[whole] * cdf[:, -1])[:, None], right=True)
        tokens[whole] = pick[:, 0].clamp(max=vocab - 1)
    nucleus = ~whole
    if nucleus.any():
        limit = top_p[nucleus][:, None]
        values, ids = probs[nucleus].topk(min(vocab, NUCLEUS_K), dim=-1)  # descending
        if bool((values.sum(-1, keepdim=True) < limit).any()):
            values, ids = probs[nucleus].sort(dim=-1, descending=True)
        values = values.masked_fill(values.cumsum(-1) - values >= limit, 0.0)
        cdf = values.cumsum(-1)
        pick = torch.searchsorted(cdf, (uniforms[nucleus] * cdf[:, -1])[:, None], right=True)
        tokens[nucleus] = ids.gather(-1, pick.clamp(max=ids.shape[-1] - 1))[:, 0]
    return tokens


def _choose(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> torch.Tensor:
    """Next token of each row: argmax at temperature 0, else a top-p sample at its temperature.

    A sampled row draws exactly one uniform from its own generator per step, so its tokens do
    not depend on which other rows share the batch.
    """
    chosen = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if not sampled:
        return chosen
    device = logits.device
    temps = torch.tensor([params[i].temperature for i in sampled], device=device)
    top_p = torch.tensor([params[i].top_p for i in sampled], device=device)
    uniforms = torch.cat([torch.rand(1, generator=generators[i]) for i in sampled]).to(device)
    probs = torch.softmax(logits[sampled] / temps[:, None], dim=-1)
    chosen[sampled] = _nucleus_sample(probs, top_p, uniforms)
    return chosen


def sample_batch(
    policy: LoadedPolicy, prompts: list[list[int]], params: list[SamplingParams]
) -> list[GenerationOutput]:
    """Sample one completion per prompt in one KV-cached batch (the decoder's loop, every row
    admitted at once)."""
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    batch = RowBatch(policy, _choose)
    rows = [batch.row(prompt, row) for prompt, row in zip(prompts, params, strict=True)]
    batch.admit(rows)
    while batch.rows:
        batch.step()
    return [row.output for row in rows]


class LocalBackend:
    """`InferenceBackend` running transformers in this process, continuously batched: rows of
    concurrent calls join one running batch (`infra.inference.decoder_thread.Decoder`, on a thread).

    A LoRA version (`PolicyHandle.base` set) runs its base's model with its adapter applied
    (peft): the base is loaded once, each adapter (megabytes) is added to it by name, and a
    batch activates the adapter of its version (a batch of the base version turns them off).
    Models and adapters are loaded on the decoder's thread, between batches, never under one.
    A row that ends leaves its KV in `prefixes` (`prefix_cache_mib`), so an episode's next step,
    whose prompt extends it, prefills its observation only.
    """

    name = "local"
    max_model_len: int | None = None  # the model's positions (`LoadedPolicy.max_context`)

    def __init__(self, config: LocalInferenceSettings | None = None):
        config = config or LocalInferenceSettings()
        self.device = torch.device(config.device)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.max_loaded = config.max_loaded
        self.max_adapters = config.max_adapters
        self._loaded: OrderedDict[tuple[str, int], LoadedPolicy] = OrderedDict()
        self._adapters: OrderedDict[tuple[str, int], LoadedPolicy] = OrderedDict()
        self._peft: dict[tuple[str, int], Any] = {}  # base version -> its PeftModel
        self._handles: dict[tuple[str, int], PolicyHandle] = {}
        self._lock = threading.Lock()  # guards the caches
        self.prefixes = PrefixStore(config.prefix_cache_mib << 20)  # the decoder's thread only
        self._decoder = Decoder(config.max_rows, self._batch)

    def _batch(self, key: object) -> RowBatch:
        """A new batch of version `key` (on the decoder's thread: no batch runs)."""
        with self._lock:
            policy = self._policy(self._handles[key])  # type: ignore[index]
            peft = self._peft.get(policy.base or key)  # type: ignore[call-overload]
            if peft is not None and policy.adapter is not None:
                peft.base_model.enable_adapter_layers()
                peft.set_adapter(policy.adapter)
            elif peft is not None:  # the base version of a model that carries adapters
                peft.base_model.disable_adapter_layers()
        return RowBatch(policy, _choose, self.prefixes.version(key))

    def _policy(self, handle: PolicyHandle) -> LoadedPolicy:
        if handle.base is not None:
            return self._adapted(handle, handle.base)
        key = (handle.run_id, handle.version)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        started = time.perf_counter()
        try:
            policy = load_policy(str(handle.path), self.device)
        except Exception as exc:
            raise _load_error("policy", handle, "config.json", exc) from exc
        log.info("loaded policy %s in %.1fs", handle.name, time.perf_counter() - started)
        self._loaded[key] = policy
        while len(self._loaded) > self.max_loaded:
            evicted, _ = self._loaded.popitem(last=False)
            self._peft.pop(evicted, None)
            self.prefixes.forget(evicted)
            for adapter in [k for k, v in self._adapters.items() if v.base == evicted]:
                del self._adapters[adapter]
                self.prefixes.forget(adapter)
            log.info("evicted policy %s/v%d", *evicted)
        return policy

    def _adapted(self, handle: PolicyHandle, base: PolicyHandle) -> LoadedPolicy:
        """The LoRA version `handle`: its base's model with the version's adapter added."""
        key, base_key = (handle.run_id, handle.version), (base.run_id, base.version)
        if key in self._adapters:
            self._adapters.move_to_end(key)
            self._loaded.move_to_end(base_key)  # its base is in use too: the LRU keeps it
            return self._adapters[key]
        base_policy = self._policy(base)
        # peft imports in ~1 s: only a worker that serves a LoRA version pays for it
        from peft import PeftModel

        name = _adapter_name(handle)
        try:
            peft = self._peft.get(base_key)
            if peft is None:
                peft = PeftModel.from_pretrained(
                    base_policy.model, str(handle.path), adapter_name=name
                )
                self._peft[base_key] = peft.eval()
            else:
                peft.load_adapter(str(handle.path), adapter_name=name)
        except Exception as exc:
            raise _load_error("LoRA policy", handle, "adapter_config.json", exc) from exc
        policy = dataclasses.replace(base_policy, model=peft, adapter=name, base=base_key)
        self._adapters[key] = policy
        while len(self._adapters) > self.max_adapters:
            evicted, old = self._adapters.popitem(last=False)
            self.prefixes.forget(evicted)
            self._peft[old.base].delete_adapter(old.adapter)  # type: ignore[index]
            log.info("dropped LoRA adapter %s/v%d", *evicted)
        return policy

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        key = (policy.run_id, policy.version)
        self._handles[key] = policy
        rows = (self._row(key, prompt, row) for prompt, row in zip(prompts, params, strict=True))
        return await all_or_cancel(rows)  # a row that fails ends the others: nobody awaits them

    async def _row(
        self, key: tuple[str, int], prompt: list[int], params: SamplingParams
    ) -> GenerationOutput:
        """One row through the decoder; cancelled, its future is too, and the row leaves the
        batch at the next step."""
        return await asyncio.wrap_future(self._decoder.submit(key, prompt, params))

    async def close(self) -> None:
        await asyncio.to_thread(self._decoder.close)
        with self._lock:
            self._loaded.clear()
            self._adapters.clear()
            self._peft.clear()


def _load_error(what: str, handle: PolicyHandle, config: str, exc: Exception) -> InferenceError:
    """A failed load of `handle` as an InferenceError: not retryable where the loader refused
    (ValueError, KeyError: transformers' unknown model_type or architecture, peft's target
    modules not found) files that are all there; retryable otherwise (I/O, out of memory), a
    refusal included while a file is missing (peft tells a missing adapter_config.json so)."""
    refused = isinstance(exc, (ValueError, KeyError)) and not isinstance(exc, OSError)
    return InferenceError(
        f"cannot load {what} {handle.name} from {handle.path}: {one_line(exc)}",
        retryable=not (refused and _intact(handle.path, config)),
    )


def _intact(path: Path, config: str) -> bool:
    """Whether `path` holds its files: those its manifest lists (a cached version, which the
    cache evicts file by file), else, with no manifest, its `config`."""
    try:
        manifest = PolicyManifest.model_validate_json((path / MANIFEST).read_bytes())
    except FileNotFoundError:
        return (path / config).is_file()
    except (OSError, ValueError):
        return False
    return all((path / name).is_file() for name in manifest.files)


def _adapter_name(handle: PolicyHandle) -> str:
    """peft adapter names may not contain dots; run ids are identifiers."""
    return f"{handle.run_id}-v{handle.version}".replace(".", "_")


def benchmark(model_dir: str, batches: list[int], new_tokens: int, prompt_tokens: int) -> None:
    """Print decode throughput of `sample_batch` at each batch size (temperature 1, seeded)."""
    policy = load_policy(model_dir, torch.device("cpu"))
    vocab = int(policy.model.config.vocab_size)
    for size in batches:
        prompts = synthetic_prompts(size, prompt_tokens, vocab)
        params = [
            SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i) for i in range(size)
        ]
        no_eos = dataclasses.replace(policy, eos_ids=frozenset())  # every row runs its budget
        sample_batch(no_eos, prompts[:1], [params[0].model_copy(update={"max_new_tokens": 2})])
        started = time.perf_counter()
        outputs = sample_batch(no_eos, prompts, params)
        elapsed = time.perf_counter() - started
        tokens = sum(len(o.token_ids) for o in outputs)
        print(
            f"batch {size:3d}: {tokens:5d} tokens in {elapsed:6.2f}s = {tokens / elapsed:8.1f} tok/s"
        )


if __name__ == "__main__":
    import argparse

    from infra.settings import load_settings

    parser = argparse.ArgumentParser(description="Throughput of the local backend on this machine.")
    parser.add_argument("model", help="preset (tiny, smollm2) or HF directory")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from infra.base_models import materialize_base_model

    directory = materialize_base_model(args.model, load_settings())
    print(f"{directory} on cpu, {torch.get_num_threads()} threads")
    benchmark(str(directory), args.batch, args.new_tokens, args.prompt_tokens)
