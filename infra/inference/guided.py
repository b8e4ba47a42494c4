"""Decoding held to one well-formed tool call: `SamplingParams.tool_choice = "required"`.

    grammar = CallGrammar.of(tokenizer, WORKSPACE_TOOLS)  # once per tokenizer (scans its vocabulary)
    guide = grammar.guide()                               # once per row
    guide.constrain(logits_row)                           # before each token: -inf where not allowed
    if guide.add(token): ...                              # after it: True once the call is complete

A small model asked for a Hermes call (`infra.inference.toolcalls`) rarely writes one: on 24
first turns of the `workspace` suite SmolLM2-135M wrote no valid call as prompted, and none with
`<tool_call>\\n{"name": "` already written for it (it invents tool names, keys and JSON). With
`tool_choice = "required"` (OpenAI's name for "this turn must be a call") every turn that its
token budget does not cut is exactly

    <tool_call>
    {"name": "<tool>", "arguments": {"<key>": "<string>", ...}}
    </tool_call>

The structure is forced, one token per decode step (the literal's own tokenization); the model
picks the tool (among the tokens that keep some tool's name possible) and writes each string
argument, held only to what a JSON string allows: no `"` but the one that ends it, no bad
escape, no special token. A string ends at a sampled token that holds its closing quote (and
perhaps the start of what follows, which is then forced).

A turn that runs out of token budget before its call is written is cut where it stands, as any
row is: the decoder reports finish "length" and the text (JSON cut inside the call) parses as an
error, which the episode sees as an error observation. The guide does not close the call for it:
a call closed around a cut argument (a file's content half written, a path cut short) would
parse as valid and be run, and the learner would see the turn as one the model chose to end.

The allowed-token masks are built once on the CPU (a scan of the vocabulary) and copied once to
each device whose logits they mask (a CUDA model's logits stay on the GPU).

Raw control characters (the newlines of a file's content) are allowed inside a string, as
`parse_tool_call` reads JSON with `strict=False`: a model writes code with real newlines.

What the learner sees: the decoder records each token's log-prob under the policy itself,
unconstrained (as it scores every token, at the row's temperature), so the importance ratio compares
like with like, while the sample is drawn from the constrained distribution. vLLM's own guide
reports the masked log-probs instead (a forced token ~0), which is why the `vllm` backend
refuses guided rows.

Not covered: tools with other than required string arguments (refused when the grammar is
built); text before or after the call; several calls in a turn; `\\uXXXX` escapes; several
forced tokens in one decode step (each is a step of its own); tokenizers whose tokens do not
decode one by one to their text (SentencePiece's leading-space marker).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from contracts.episode import ToolSpec
from contracts.task import SamplingParams
from infra.inference.stops import token_texts
from infra.inference.toolcalls import CALL_CLOSE, CALL_OPEN

START = CALL_OPEN + '\n{"name": "'
END = "}}\n" + CALL_CLOSE
CPU = torch.device("cpu")
ESCAPES = frozenset('"\\/bfnrt')
"""What may follow a backslash inside a guided string (`\\uXXXX` is not offered)."""


@dataclass(frozen=True)
class _Shape:
    """One tool's call as the literal texts around its string arguments."""

    name: str
    keys: tuple[str, ...]

    @classmethod
    def of(cls, tool: ToolSpec) -> _Shape:
        properties: dict[str, Any] = tool.parameters.get("properties", {})
        required = list(tool.parameters.get("required", []))
        if set(required) != set(properties) or any(
            p.get("type") != "string" for p in properties.values()
        ):
            raise ValueError(
                f"tool {tool.name!r}: a guided call needs every argument to be a required string"
            )
        return cls(json.dumps(tool.name)[1:-1], tuple(required))

    def head(self) -> str:
        """The call's text from the tool's name to its first argument's string (or its end)."""
        if not self.keys:
            return self.name + '", "arguments": {' + END
        return f'{self.name}", "arguments": {{{json.dumps(self.keys[0])}: "'

    def after(self, arg: int) -> str:
        """The text from the closing quote of argument `arg` to the next string or the end."""
        if arg + 1 < len(self.keys):
            return f'", {json.dumps(self.keys[arg + 1])}: "'
        return '"' + END


class CallGrammar:
    """A tokenizer's vocabulary read for guided calls to `tools`, with the masks it needs."""

    def __init__(
        self,
        texts: Sequence[str],
        special: set[int],
        encode: Callable[[str], list[int]],
        tools: Sequence[ToolSpec],
    ):
        self.texts, self.encode = list(texts), encode
        self.shapes = tuple(_Shape.of(tool) for tool in tools)
        self._usable = [bool(text) and i not in special for i, text in enumerate(self.texts)]
        self._masks: dict[tuple[Hashable, torch.device], torch.Tensor] = {}
        self._literals: dict[str, tuple[int, ...]] = {}

    @classmethod
    def of(cls, tokenizer: Any, tools: Sequence[ToolSpec], vocab_size: int = 0) -> CallGrammar:
        """The grammar of `tokenizer` for `tools`; masks cover `vocab_size` logits (a model's
        output may be wider than its tokenizer's vocabulary)."""
        texts = token_texts(tokenizer, vocab_size)
        special = set(tokenizer.all_special_ids) | set(
            getattr(tokenizer, "added_tokens_decoder", {})
        )

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        return cls(texts, special, encode, tools)

    def guide(self) -> CallGuide:
        """The state of one row writing its call."""
        return CallGuide(self)

    def literal(self, text: str) -> tuple[int, ...]:
        """`text` as forced tokens (its tokenizer's encoding)."""
        if text not in self._literals:
            self._literals[text] = tuple(self.encode(text))
        return self._literals[text]

    def name_mask(self, typed: str, device: torch.device = CPU) -> torch.Tensor:
        """Tokens that, after `typed`, keep the text a prefix of some tool's name and what
        follows it (on `device`)."""
        wanted = [shape.head() for shape in self.shapes]
        return self._mask(
            ("name", typed), device, lambda text: any(w.startswith(typed + text) for w in wanted)
        )

    def string_mask(
        self, following: str, escaped: bool, device: torch.device = CPU
    ) -> torch.Tensor:
        """Tokens allowed inside a string that `following` (its closing quote first) ends,
        after a backslash when `escaped` (on `device`)."""
        return self._mask(
            ("string", following, escaped),
            device,
            lambda text: read(text, escaped, following) is not None,
        )

    def _mask(
        self, key: Hashable, device: torch.device, keep: Callable[[str], bool]
    ) -> torch.Tensor:
        """The mask `key` on `device`: scanned once on the CPU, copied once per device (a mask
        must be on its logits' device, and a copy per step would cost a transfer per token)."""
        if (key, device) not in self._masks:
            if (key, CPU) not in self._masks:
                self._masks[key, CPU] = torch.tensor(
                    [usable and keep(t) for usable, t in zip(self._usable, self.texts, strict=True)]
                )
            self._masks[key, device] = self._masks[key, CPU].to(device)
        return self._masks[key, device]


def read(text: str, escaped: bool, following: str) -> tuple[int | None, bool] | None:
    """A token's `text` read inside a JSON string (after a backslash when `escaped`) that
    `following` ends: None if it may not stand there; else how much of `following` it writes
    (None: the string goes on) and whether it ends on a backslash whose escape is pending."""
    for at, char in enumerate(text):
        if escaped:
            if char not in ESCAPES:
                return None
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            tail = text[at:]
            return (len(tail), False) if following.startswith(tail) else None
    return None, escaped


class Guides:
    """The guides of one tokenizer's rows: a grammar built on the first row that asks for one."""

    def __init__(self, tokenizer: Any, tools: Sequence[ToolSpec], vocab_size: int = 0):
        self.tokenizer, self.tools, self.vocab_size = tokenizer, tuple(tools), vocab_size
        self._grammar: CallGrammar | None = None

    def guide(self, params: SamplingParams) -> CallGuide | None:
        """A guide for a row of `params`, or None when it is not guided."""
        if params.tool_choice != "required":
            return None
        if self._grammar is None:
            self._grammar = CallGrammar.of(self.tokenizer, self.tools, self.vocab_size)
        return self._grammar.guide()


class CallGuide:
    """One row's progress through its call: forced literals, the tool's name, the strings."""

    def __init__(self, grammar: CallGrammar):
        self.grammar = grammar
        self.forced: deque[int] = deque()
        self.typed = ""
        self.shape: _Shape | None = None
        self.arg = -1  # -1: the name is being written; else the string argument being written
        self.escaped = False  # inside a string, after a backslash
        self.done = False
        self._then = -1  # where the row goes once the forced tokens are written
        self._force(START, then=-1)

    def constrain(self, logits: torch.Tensor) -> None:
        """Set the logits of the tokens this row may not write next to -inf (in place)."""
        if self.forced:
            keep = logits[self.forced[0]].clone()
            logits.fill_(float("-inf"))
            logits[self.forced[0]] = keep
            return
        if self.shape is None:
            allowed = self.grammar.name_mask(self.typed, logits.device)
        else:
            following = self.shape.after(self.arg)
            allowed = self.grammar.string_mask(following, self.escaped, logits.device)
        width = min(len(allowed), logits.shape[-1])
        logits[:width].masked_fill_(~allowed[:width], float("-inf"))
        logits[width:] = float("-inf")

    def add(self, token: int) -> bool:
        """Take the row's next token (one `constrain` allowed); True once the call is written."""
        if self.forced:
            if token != self.forced.popleft():
                raise ValueError(f"token {token} was not the forced one")
            if not self.forced:
                self._enter(self._then)
            return self.done
        text = self.grammar.texts[token]
        if self.shape is None:
            self._add_name(text)
            return self.done
        following = self.shape.after(self.arg)
        reading = read(text, self.escaped, following)
        if reading is None:
            raise ValueError(f"token {token} may not stand in this string")
        written, self.escaped = reading
        if written is not None:
            self._force(following[written:], then=self.arg + 1)
        return self.done

    def _add_name(self, text: str) -> None:
        self.typed += text
        matches = [shape for shape in self.grammar.shapes if shape.head().startswith(self.typed)]
        if not matches:
            raise ValueError(f"{self.typed!r} is no tool's name")
        if len(matches) == 1:
            shape = matches[0]
            self.shape = shape
            self._force(shape.head()[len(self.typed) :], then=0)

    def _force(self, text: str, then: int) -> None:
        self.forced = deque(self.grammar.literal(text))
        self._then = then
        if not self.forced:
            self._enter(then)

    def _enter(self, arg: int) -> None:
        self.arg = arg
        if self.shape is not None and arg >= len(self.shape.keys):
            self.done = True
