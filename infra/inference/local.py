"""Local inference backend: transformers in the worker process (CPU by default), batched.

    backend = LocalBackend(settings.inference.local)     # device, threads, max_loaded
    outputs = await backend.generate(prompt_ids, params, policy)

`sample_batch` is its own decode loop rather than `model.generate`, because every row has its
own sampling params (temperature, top-p, max_new_tokens, seed): prompts are left-padded into one
batch, the KV cache is reused between steps, rows that finish (EOS or their token budget) are
dropped from the batch, and each row draws from its own `torch.Generator`, so a seeded row
samples the same tokens whatever else shares its batch. Temperature 0 is greedy (argmax).

Log-probs: for each sampled token we store `log_softmax(logits)[token]` of the raw logits at
temperature 1 (the policy's own probability), which is what the learner's importance ratio
compares against; it is *not* the log-prob under the temperature/top-p sampling distribution.

At most `max_loaded` policy versions (default 2) stay loaded; a batch keeps a reference to its
model, so evicting a version never disturbs a batch that is still running on it.

Throughput on this machine:  python -m infra.inference.local smollm2 --batch 1 8 32
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from contracts.task import SamplingParams
from infra.inference.base import FinishReason, GenerationOutput, InferenceError, PolicyHandle
from infra.settings import LocalInferenceSettings

log = logging.getLogger(__name__)


@dataclass
class LoadedPolicy:
    """A policy's model with what the decode loop needs to know about it."""

    model: Any
    eos_ids: frozenset[int]
    pad_id: int
    max_context: int
    fence_ids: frozenset[int] = frozenset()
    """Tokens whose text contains a code fence (```), for `stop_after_code_block`."""


def load_policy(path: str, device: torch.device) -> LoadedPolicy:
    """Load an HF causal-LM directory in float32, in eval mode, on `device`."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
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
    max_context = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
    return LoadedPolicy(model, frozenset(eos), int(pad), max_context, _fence_ids(path))


def _fence_ids(path: str) -> frozenset[int]:
    """Ids of every token whose text contains a code fence (```)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return frozenset(
        token_id
        for token, token_id in tokenizer.get_vocab().items()
        if "```" in tokenizer.convert_tokens_to_string([token])
    )


def _row_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else random.getrandbits(63))
    return generator


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


@torch.inference_mode()
def sample_batch(
    policy: LoadedPolicy, prompts: list[list[int]], params: list[SamplingParams]
) -> list[GenerationOutput]:
    """Sample one completion per prompt in one left-padded, KV-cached batch."""
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
    model = policy.model
    device = next(model.parameters()).device
    budgets = [
        min(p.max_new_tokens, policy.max_context - len(ids))
        for ids, p in zip(prompts, params, strict=True)
    ]
    outputs = [GenerationOutput([], [], "length") for _ in prompts]
    rows = [i for i, b in enumerate(budgets) if b > 0 and prompts[i]]  # rows still decoding
    if not rows:
        return outputs
    generators = [_row_generator(params[i].seed) for i in rows]
    row_params = [params[i] for i in rows]
    fences = [0] * len(prompts)  # code fences each row has written

    width = max(len(prompts[i]) for i in rows)
    input_ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        input_ids[r, width - len(prompts[i]) :] = torch.tensor(prompts[i])
        mask[r, width - len(prompts[i]) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.cache
    next_position = positions[:, -1:] + 1

    for _ in range(max(budgets[i] for i in rows)):
        logits = out.logits[:, -1, :].float()
        tokens = _choose(logits, row_params, generators)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
        keep: list[int] = []
        for r, (i, token, logprob) in enumerate(
            zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            output = outputs[i]
            output.token_ids.append(token)
            output.logprobs.append(logprob)
            finish: FinishReason | None = None
            fences[i] += token in policy.fence_ids
            if token in policy.eos_ids or (params[i].stop_after_code_block and fences[i] >= 2):
                finish = "stop"
            elif len(output.token_ids) >= budgets[i]:
                finish = "length"
            if finish is None:
                keep.append(r)
            else:
                output.finish_reason = finish
        if not keep:
            break
        if len(keep) < len(rows):  # drop finished rows from the batch and the cache
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            tokens, mask, next_position = tokens[index], mask[index], next_position[index]
            rows = [rows[r] for r in keep]
            generators = [generators[r] for r in keep]
            row_params = [row_params[r] for r in keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=next_position,
            cache=cache,
            use_cache=True,
        )
        next_position = next_position + 1
    return outputs


class LocalBackend:
    """`InferenceBackend` running transformers in this process; one batch at a time."""

    name = "local"

    def __init__(self, config: LocalInferenceSettings | None = None):
        config = config or LocalInferenceSettings()
        self.device = torch.device(config.device)
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        self.max_loaded = config.max_loaded
        self._loaded: OrderedDict[tuple[str, int], LoadedPolicy] = OrderedDict()
        self._lock = threading.Lock()  # one forward at a time, and guards `_loaded`
        self.tokens_generated = 0
        self.busy_s = 0.0

    def loaded_versions(self) -> list[tuple[str, int]]:
        """(run, version) of the loaded policies, least recently used first."""
        return list(self._loaded)

    def _policy(self, handle: PolicyHandle) -> LoadedPolicy:
        key = (handle.run_id, handle.version)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        started = time.perf_counter()
        try:
            policy = load_policy(str(handle.path), self.device)
        except (OSError, ValueError) as exc:
            raise InferenceError(
                f"cannot load policy {handle.name} from {handle.path}: {exc}"
            ) from exc
        log.info("loaded policy %s in %.1fs", handle.name, time.perf_counter() - started)
        self._loaded[key] = policy
        while len(self._loaded) > self.max_loaded:
            evicted, _ = self._loaded.popitem(last=False)
            log.info("evicted policy %s/v%d", *evicted)
        return policy

    def generate_sync(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        with self._lock:
            loaded = self._policy(policy)
            started = time.perf_counter()
            outputs = sample_batch(loaded, prompts, params)
            self.busy_s += time.perf_counter() - started
            self.tokens_generated += sum(len(o.token_ids) for o in outputs)
            return outputs

    async def generate(
        self, prompts: list[list[int]], params: list[SamplingParams], policy: PolicyHandle
    ) -> list[GenerationOutput]:
        return await asyncio.to_thread(self.generate_sync, prompts, params, policy)

    async def close(self) -> None:
        with self._lock:
            self._loaded.clear()


def benchmark(model_dir: str, batches: list[int], new_tokens: int, prompt_tokens: int) -> None:
    """Print decode throughput of `sample_batch` at each batch size (temperature 1, seeded)."""
    policy = load_policy(model_dir, torch.device("cpu"))
    vocab = int(policy.model.config.vocab_size)
    for size in batches:
        prompts = [
            [(97 + 31 * i + 7 * k) % vocab for k in range(prompt_tokens)] for i in range(size)
        ]
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
    from infra.policy import materialize_base_model

    directory = materialize_base_model(args.model, load_settings())
    print(f"{directory} on cpu, {torch.get_num_threads()} threads")
    benchmark(str(directory), args.batch, args.new_tokens, args.prompt_tokens)
