"""Guided tool calls (`infra.inference.guided`): whatever the logits, a guided turn is one valid
call to a known tool, or one its budget cut, which ends "length" and parses as an error (never a
call closed around a cut argument); the guide does not bend a call the model writes well; it
refuses what it cannot guide; its masks are on the logits' device. On SmolLM2's real vocabulary
(multi-character tokens, tokens that close a string and open what follows) with random logits,
and through the decode loop on the tiny model, where the recorded log-probs must stay the
policy's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from contracts.episode import WORKSPACE_TOOLS, ToolCall, ToolSpec
from contracts.task import SamplingParams
from infra.inference.guided import START, CallGrammar, CallGuide, read
from infra.inference.local import LoadedPolicy, sample_batch
from infra.inference.toolcalls import parse_tool_call
from tests.infra.inference.scripted import render_tool_call
from tests.infra.inference.test_local import prompts, teacher_forced

pytestmark = pytest.mark.xdist_group(__name__)  # one worker loads the module's models


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2))


@pytest.fixture(scope="module")
def grammar(tokenizer) -> CallGrammar:  # type: ignore[no-untyped-def]
    return CallGrammar.of(tokenizer, WORKSPACE_TOOLS)


def walk(guide: CallGuide, pick, budget: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Run `guide` to its end (or `budget` tokens, as the decoder cuts a row), `pick` choosing
    among the allowed logits."""
    tokens: list[int] = []
    while len(tokens) < budget:
        logits = torch.zeros(len(guide.grammar.texts))
        guide.constrain(logits)
        token = pick(logits, tokens)
        tokens.append(token)
        if guide.add(token):
            break
    return tokens


def test_any_logits_give_one_valid_call_or_a_cut_turn(tokenizer, grammar) -> None:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(0)

    def random_pick(logits: torch.Tensor, tokens: list[int]) -> int:
        noise = torch.randn(len(logits), generator=generator) * 4
        probs = torch.softmax(logits + noise, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    chosen: set[str] = set()
    cut = 0
    for trial in range(16):
        budget = (40, 64, 90, 200)[trial % 4]
        guide = grammar.guide()
        tokens = walk(guide, random_pick, budget)
        text = tokenizer.decode(tokens)
        call = parse_tool_call(text, WORKSPACE_TOOLS)
        if guide.shape is not None:
            chosen.add(guide.shape.name)
        if not guide.done:  # the budget ran out first: the turn stays cut, no call is run
            assert len(tokens) == budget and call.error is not None, text
            cut += 1
            continue
        assert call.error is None, text
        assert len(tokens) <= budget and text.endswith("}}\n</tool_call>")
    assert chosen == {tool.name for tool in WORKSPACE_TOOLS} and 0 < cut < 16


def writing(target: str, grammar: CallGrammar):  # type: ignore[no-untyped-def]
    """A model that wants to write `target`: the allowed token that writes most of what is left."""

    def longest_match(logits: torch.Tensor, tokens: list[int]) -> int:
        left = target[len("".join(grammar.texts[t] for t in tokens)) :]
        allowed = torch.isfinite(logits).nonzero()[:, 0].tolist()
        fits = [t for t in allowed if left.startswith(grammar.texts[t])]
        return max(fits, key=lambda t: len(grammar.texts[t]))

    return longest_match


def test_a_call_the_model_writes_well_comes_out_unchanged(tokenizer, grammar) -> None:  # type: ignore[no-untyped-def]
    content = 'def f(x):\n    return "a\\\\b" + x  # quotes, a backslash, a tab:\t\n'
    target = render_tool_call(
        ToolCall(name="write_file", arguments={"path": "src/m.py", "content": content})
    )
    tokens = walk(grammar.guide(), writing(target, grammar), 400)
    assert tokenizer.decode(tokens) == target
    assert parse_tool_call(target, WORKSPACE_TOOLS).arguments["content"] == content


def test_a_string_cut_by_the_budget_stays_cut_and_parses_as_an_error(
    tokenizer,
    grammar,  # type: ignore[no-untyped-def]
) -> None:
    """Closing it (the rest of `write_file` forced, `content` empty) would make a cut path a
    valid call that is run."""
    by_text = {text: i for i, text in enumerate(grammar.texts)}

    def write_path_forever(logits: torch.Tensor, tokens: list[int]) -> int:
        """`write_file`, then "x" in its path for as long as the guide lets it."""
        allowed = torch.isfinite(logits).nonzero()[:, 0].tolist()
        for text in ("x", "write"):
            if len(allowed) > 1 and by_text[text] in allowed:
                return by_text[text]
        return int(allowed[0])

    guide = grammar.guide()
    tokens = walk(guide, write_path_forever, 40)
    text = tokenizer.decode(tokens)
    assert len(tokens) == 40 and not guide.done and text.endswith("xxx")
    assert text.startswith('<tool_call>\n{"name": "write_file", "arguments": {"path": "x')
    assert "not valid JSON" in str(parse_tool_call(text, WORKSPACE_TOOLS).error)


def toy_grammar() -> CallGrammar:
    """A toy vocabulary (a token's text is itself, encoded longest match first) for `read_file`,
    `read_dir` (a `path` each) and `stop` (no arguments)."""

    def tool(name: str, *keys: str) -> ToolSpec:
        properties = {key: {"type": "string"} for key in keys}
        schema = {"type": "object", "properties": properties, "required": list(keys)}
        return ToolSpec(name=name, description="", parameters=schema)

    whole = ['"}}\n</tool_call>', 'stop", "arguments": {}}\n</tool_call>', "read_", "dir"]
    texts = sorted({START, *whole, *"".join([START, *whole, ', "arguments": {path'])})

    def encode(text: str) -> list[int]:
        ids = []
        while text:
            token = max((t for t in texts if text.startswith(t)), key=len)
            ids.append(texts.index(token))
            text = text[len(token) :]
        return ids

    tools = [tool("read_file", "path"), tool("read_dir", "path"), tool("stop")]
    return CallGrammar(texts, set(), encode, tools)


def test_a_token_may_write_a_whole_literal_and_tools_may_share_a_prefix() -> None:
    toy = toy_grammar()
    texts = toy.texts
    for call in (ToolCall(name="read_dir", arguments={"path": "a"}), ToolCall(name="stop")):
        target = render_tool_call(call)
        tokens = walk(toy.guide(), writing(target, toy), 100)
        assert "".join(texts[t] for t in tokens) == target
    assert len(tokens) == 2  # `stop`'s one token wrote the rest of the call: it is complete


def test_what_a_string_may_hold() -> None:
    end = '"}}\n</tool_call>'
    assert read("abc", False, end) == (None, False)
    assert read("a\nb\t", False, end) == (None, False)  # raw control characters: strict=False
    assert read('a\\"b', False, end) == (None, False)  # an escaped quote goes on
    assert read("ab\\", False, end) == (None, True)  # the escape waits for the next token
    assert read('"x', True, end) == (None, False)  # ... which may be the quote it escapes
    assert read("q", True, end) is None  # not an escape JSON knows
    assert read('a"}}', False, end) == (3, False)  # closes the string, writes what follows
    assert read('a", "', False, end) is None  # what follows is not this call's
    assert read('a"', False, '", "content": "') == (1, False)


def test_tools_it_cannot_guide_and_tokens_it_did_not_allow_are_refused(
    tokenizer,
    grammar,  # type: ignore[no-untyped-def]
) -> None:
    counted = ToolSpec(
        name="sleep",
        description="",
        parameters={"type": "object", "properties": {"s": {"type": "integer"}}, "required": ["s"]},
    )
    with pytest.raises(ValueError, match="every argument to be a required string"):
        CallGrammar.of(tokenizer, [counted])
    guide = grammar.guide()
    logits = torch.zeros(len(grammar.texts))
    guide.constrain(logits)
    forced = int(torch.isfinite(logits).nonzero()[0, 0])
    assert torch.isfinite(logits).sum() == 1  # `<tool_call>` is written for the model
    with pytest.raises(ValueError, match="not the forced one"):
        guide.add(forced + 1)
    for token in grammar.literal(START)[1:]:
        guide.add(token)
    with pytest.raises(ValueError, match="is no tool's name"):
        guide.add(grammar.literal("grep")[0])
    guide = grammar.guide()
    while guide.forced or guide.shape is None:
        guide.add(guide.forced[0] if guide.forced else grammar.texts.index("bash"))
    with pytest.raises(ValueError, match="may not stand in this string"):
        guide.add(grammar.texts.index('")'))  # a quote, then not what follows the command


def test_guided_rows_in_the_decode_loop_keep_the_policys_log_probs(
    policy: LoadedPolicy,
) -> None:
    rows = prompts(4)
    free = [SamplingParams(temperature=1.0, max_new_tokens=160, seed=s) for s in (1, 2)]
    guided = [
        SamplingParams(temperature=t, max_new_tokens=160, seed=s, tool_choice="required")
        for t, s in ((1.0, 3), (0.0, 4))
    ]
    outputs = sample_batch(policy, rows, free + guided)
    assert [o.token_ids for o in outputs[:2]] == [
        o.token_ids for o in sample_batch(policy, rows[:2], free)
    ]  # unguided rows of the same batch are untouched ...
    tokenizer = policy.guides.tokenizer
    for output in outputs[:2]:  # ... and, the tiny model being untrained, write no call
        assert parse_tool_call(tokenizer.decode(output.token_ids), WORKSPACE_TOOLS).error
    finishes = []
    for prompt, output in zip(rows[2:], outputs[2:], strict=True):
        call = parse_tool_call(tokenizer.decode(output.token_ids), WORKSPACE_TOOLS)
        # a call written whole ends "stop"; one its budget cut ends "length" and is no call
        assert (call.error is None) == (output.finish_reason == "stop")
        finishes.append(output.finish_reason)
        recorded = torch.tensor(output.logprobs)
        assert torch.allclose(recorded, teacher_forced(policy, prompt, output.token_ids), atol=1e-4)
    assert finishes == ["length", "stop"]  # `write_file`'s content cut; a whole `submit`


def test_a_guided_row_its_budget_cuts_ends_length_and_is_no_call(policy: LoadedPolicy) -> None:
    """The tiny model writes bytes: at 100 tokens its `write_file` path is still open."""
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=100, seed=s, tool_choice="required")
        for s in (1, 2, 3)
    ]
    tokenizer = policy.guides.tokenizer
    for output in sample_batch(policy, prompts(3), params):
        text = tokenizer.decode(output.token_ids)
        assert len(output.token_ids) == 100 and output.finish_reason == "length", text
        assert parse_tool_call(text, WORKSPACE_TOOLS).error is not None, text


class SameDevice(TorchFunctionMode):
    """Refuses a mask on another device than what it masks, as CUDA does (the CPU and the meta
    device let it pass)."""

    def __torch_function__(self, func: Callable[..., Any], types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.Tensor.masked_fill_ and args[0].device != args[1].device:
            raise RuntimeError("expected self and mask to be on the same device")
        return func(*args, **(kwargs or {}))


def constrain_each_phase(guide: CallGuide, device: torch.device) -> list[torch.Tensor]:
    """Constrain `device` logits while the tool's name, then its first string, is written."""
    texts = guide.grammar.texts
    constrained = []
    for written in ("read_", "dir", "a"):
        while guide.forced:
            guide.add(guide.forced[0])
        logits = torch.zeros(len(texts), device=device)
        guide.constrain(logits)
        constrained.append(logits)
        guide.add(texts.index(written))
    return constrained


def test_masks_are_on_the_logits_device_built_once_per_device() -> None:
    toy, meta = toy_grammar(), torch.device("meta")
    with SameDevice():
        constrained = constrain_each_phase(toy.guide(), meta)
    assert [logits.device for logits in constrained] == [meta] * 3
    assert toy.name_mask("", meta).device == meta
    assert toy.name_mask("", meta) is toy.name_mask("", meta)  # cached, not copied per step
    assert toy.name_mask("").device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_guided_logits_on_cuda_are_constrained_as_on_the_cpu() -> None:
    toy, cuda = toy_grammar(), torch.device("cuda")
    on_cpu = constrain_each_phase(toy.guide(), torch.device("cpu"))
    on_cuda = constrain_each_phase(toy.guide(), cuda)
    for cpu_logits, cuda_logits in zip(on_cpu, on_cuda, strict=True):
        assert cuda_logits.device.type == "cuda" and torch.equal(cuda_logits.cpu(), cpu_logits)
