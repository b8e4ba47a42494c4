"""The tool-call format, taught to the model and parsed in one place: Hermes tags around JSON.

    <tool_call>
    {"name": "bash", "arguments": {"command": "pytest -q"}}
    </tool_call>

SmolLM2's and Qwen's chat templates speak this format. Qwen's template renders the `tools`
argument itself (a `# Tools` block in the system message) and has a `tool` role; SmolLM2's
template and the tiny preset's ChatML ignore both. For those, the documented fallback is used:

- the tools are listed in the system message by `tools_system_block` (Qwen's template's words:
  the tools as JSON lines inside `<tools></tools>`, and the call format; not its "You may call
  one or more functions", which the system prompt's one call a turn contradicted), and
- a tool's result comes back as a `user` message wrapping it in `<tool_response>` tags
  (`observation_message`), which is what Qwen's template renders a `tool` message as anyway.

`template_renders_tools(tokenizer)` decides which (it renders a conversation with and without
`tools` and compares). `parse_tool_call` turns a model's turn into a `ToolCall`, leniently where
intent is unambiguous (arguments given as a JSON string, `parameters` for `arguments`, a code
fence inside the tags, a missing closing tag, junk after the JSON, raw newlines inside a string)
and strictly otherwise: one call per turn; no call, broken JSON (nesting too deep for the decoder
included), an unknown tool or bad arguments give a `ToolCall` whose `error` says what was wrong,
in words the model can act on. It never raises. A turn that its token limit ended (`cut_at`)
before its call was whole is told so, with how to fit (a call begun: write less per call; none
begun: answer with the call first): the JSON's own complaint (an unterminated string) did not
say why, and a guided turn fails no other way.

Which tag is the call (one rule for the parser, `further_calls` and the stop rule
`call_closed`): `infra.inference.calltags`. A call drafted while the model thinks is none: each
takes `thinking`, whether the turn starts inside a think block its prompt opened
(`calltags.starts_thinking`); else only a `<think>` that starts the turn opens one, and a
`<think>` anywhere else is text. Of the tags after the thinking, the call is the first whose
JSON reads as a call (an object with a string "name": read leniently, so a call whose JSON
repeats a key or holds NaN is still the call, and an error); a tag only mentioned ("I will use
<tool_call> tags") or a broken draft is passed over; where none reads as a call, the last tag's
error is given. `further_calls` counts the well-formed calls after the call (the next
observation mentions them).

Every `ToolCall` it returns crosses Temporal's pydantic payloads unchanged: it stays far below
the JSON depth pydantic reads and writes (200, and a `GenerateResponse` carries the call a few
levels down): a valid call's argument values nest at most `MAX_DEPTH` levels (deeper is bad
arguments), and an error call keeps the model's arguments only when they are flat (scalar values)
and at most `MAX_KEPT_CHARS` of JSON, else none. It holds no string that is not valid Unicode
(JSON's "\ud83d" alone decodes to a lone surrogate, which no payload can encode: the activity's
result would fail, and be retried, for ever) and no number that is not finite (JSON's NaN and
Infinity, which Python's decoder takes, and 1e400, which it reads as inf: a payload writes them as
null, so the call would come back another): such a call is an error call keeping no arguments. Nor
does it hold a call whose JSON repeats a key in one object (Python's decoder keeps the last value:
`{"command": "ls", "command": "rm -rf *"}` would run what the model may not have meant): an error
call naming the key, keeping no arguments.

A call crosses Temporal as its brief (`ToolCall.brief`, its values cut to a few hundred
characters); `full_call` gives back the whole call where it is needed, by parsing the turn's text
again (the parse is deterministic: the same text and flag, the same call). It parses a cut brief
only, and the error of a turn cut by its token limit is never cut (it names no arguments and is
shorter than a brief keeps), so `full_call` needs no limit. A record says `thinking` only where
it is true (`CompletionRecord.thinking` is left out while false, for the release before): a
record without it is read as not thinking, and where that reading's brief is not the call's
(a record of the release before, which hid every think block, wherever it stood:
`calltags.tags_before_the_flag`), as thinking, then by that release's rule; the first reading
whose brief it is is the call. A record of this release is read as it was parsed, first: a
reading that fails it is never tried for it.

Not covered here: running a call (infra/environments/), how a template is rendered into token
ids (infra/inference/prompts.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from contracts.episode import ToolCall, ToolSpec
from infra.inference.base import one_line
from infra.inference.calltags import CALL_CLOSE as CALL_CLOSE
from infra.inference.calltags import CALL_OPEN as CALL_OPEN
from infra.inference.calltags import CallWatch, tags, tags_before_the_flag, value_start

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
CALL_EXAMPLE = (
    f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}'
)
MAX_DEPTH = 16
"""How deep a valid call's argument value may nest (lists and objects in lists and objects)."""
MAX_KEPT_CHARS = 2000
"""An error call keeps flat arguments up to this size (JSON characters), to show what was asked."""
SCALARS = (str, int, float, bool, type(None))
NOT_UNICODE = (
    "not valid Unicode: a lone surrogate (a \\ud800-\\udfff escape that is not half of a pair); "
    "write the character itself"
)
"""The error of a call holding a string that is not valid Unicode (it keeps no arguments)."""
NOT_FINITE = "not valid JSON: NaN/Infinity (a number must be finite)"
"""The error of a call holding a number that is not finite (the decoder found the first)."""
KEY_SHOWN_CHARS = 60
"""How much of a repeated key its error names (a longer one is cut)."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")
CUT_ADVICE = (
    "Write less per call: e.g. change a file with bash (sed -i, a short heredoc) rather than "
    "write_file with all of it"
)
"""What a turn cut by its token limit in its call is told to do (`parse_tool_call`'s `cut_at`)."""
CALL_FIRST_ADVICE = "Answer with the call first, writing little or nothing before it"
"""What a turn cut by its token limit before any call is told to do."""


def tool_schemas(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """`tools` as chat templates take them: OpenAI's `{"type": "function", "function": …}`."""
    return [{"type": "function", "function": tool.model_dump()} for tool in tools]


def tools_system_block(tools: Sequence[ToolSpec]) -> str:
    """The fallback's tool list and call format, appended to the system message."""
    listed = "\n".join(json.dumps(schema) for schema in tool_schemas(tools))
    return (
        "# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        f"within {CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_EXAMPLE}"
    )


def template_renders_tools(tokenizer: Any, tools: Sequence[ToolSpec]) -> bool:
    """Whether the tokenizer's chat template renders the `tools` argument (and so, by the
    convention of the templates that do, a `tool` role)."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]

    def render(**extra: Any) -> str:
        text: str = tokenizer.apply_chat_template(messages, tokenize=False, **extra)
        return text

    return render(tools=tool_schemas(tools)) != render()


def observation_message(text: str, *, tool_role: bool) -> dict[str, str]:
    """A tool's result as the next message: role `tool`, or the fallback's wrapped `user`."""
    if tool_role:
        return {"role": "tool", "content": text}
    return {"role": "user", "content": f"{RESPONSE_OPEN}\n{text}\n{RESPONSE_CLOSE}"}


def parse_tool_call(
    text: str,
    tools: Sequence[ToolSpec],
    *,
    cut_at: int | None = None,
    thinking: bool = False,
) -> ToolCall:
    """The first tool call in a model's turn, checked against `tools`; never raises. `cut_at`:
    the turn's tokens, where its token limit ended it (finish reason "length"): a call not yet
    whole is then told as cut: none begun (`CALL_FIRST_ADVICE`), or its JSON unfinished
    (`CUT_ADVICE`). `thinking`: the turn starts inside a think block (`calltags`). Which tag is
    the call: the module's docstring."""
    return _parsed(text, list(tags(text, thinking)), tools, cut_at)


def _parsed(
    text: str, found: list[tuple[int, int | None]], tools: Sequence[ToolSpec], cut_at: int | None
) -> ToolCall:
    """`parse_tool_call` of `text` whose call tags (`calltags.tags`' pairs) are `found`."""
    if not found:
        if cut_at is not None:
            return _error(
                f"the turn ran out of its {cut_at} tokens before any tool call. "
                f"{CALL_FIRST_ADVICE}: {CALL_EXAMPLE}"
            )
        return _error(f"no tool call found. Answer with exactly one call: {CALL_EXAMPLE}")
    calls = [tag for tag, end in found if end is not None]
    start = calls[0] if calls else found[-1][0]
    try:
        value, _ = _first_value(text, start)
    except json.JSONDecodeError as exc:
        if cut_at is not None:
            return _cut(cut_at, _json_problem(exc))
        return _error(f"the tool call is not valid JSON: {_json_problem(exc)}")
    except _NotFinite as exc:
        return _error(f"the tool call is {NOT_FINITE}: {exc}")
    except _RepeatedKey as exc:
        return _error(f"the tool call {exc}")
    except Exception as exc:  # RecursionError (nested too deep), an integer of 4300+ digits
        return _error(f"the tool call is not valid JSON: {one_line(exc)}")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return _error('the tool call must be a JSON object with a "name" and "arguments"')
    name: str = value["name"]
    if _not_unicode(name):
        return _error(f"the tool call's name is {NOT_UNICODE}")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: the arguments object as a JSON string
        try:
            arguments = _decoder().decode(arguments) if arguments.strip() else {}
        except _NotFinite as exc:
            return _error(f"the arguments of {name!r} are {NOT_FINITE}: {exc}", name)
        except _RepeatedKey as exc:
            return _error(f"the arguments of {name!r}: the JSON {exc}", name)
        except Exception:  # JSONDecodeError, RecursionError, …
            return _error(f"the arguments of {name!r} are not a JSON object", name)
    if not isinstance(arguments, dict):
        return _error(f"the arguments of {name!r} must be a JSON object", name)
    if _not_unicode(arguments):  # before an error can keep them
        return _error(f"the arguments of {name!r} are {NOT_UNICODE}", name)
    by_name = {tool.name: tool for tool in tools}
    tool = by_name.get(name)
    if tool is None:
        known = ", ".join(by_name)
        return _error(f"unknown tool {name!r}; the tools are: {known}", name, arguments)
    problem = _check_arguments(tool, arguments)
    if problem:
        return _error(f"bad arguments for {name!r}: {problem}", name, arguments)
    return ToolCall(name=name, arguments=arguments)


def further_calls(text: str, *, thinking: bool = False) -> int:
    """How many well-formed calls a turn writes after its call (which alone runs)."""
    return max(sum(end is not None for _, end in tags(text, thinking)) - 1, 0)


def call_closed(text: str, *, thinking: bool = False) -> bool:
    """Whether `text` holds its call (the one `parse_tool_call` takes) and a closing tag after
    the call's JSON: where `stop_after_tool_call` ends a turn (`infra.inference.stops`, which
    asks a `calltags.CallWatch` as the turn grows)."""
    return CallWatch(thinking).closed(text)


def _first_value(text: str, start: int) -> tuple[Any, int]:
    """The first JSON value after the opening tag at `start`, and where it ends in `text`;
    what follows it (a closing tag, a fence, junk) is ignored. Raises what the decoder does
    (its positions count from the value's start)."""
    at = value_start(text, start)
    value, end = _decoder().raw_decode(text[at:])
    return value, at + end


class _NotFinite(ValueError):
    """A number of the call's JSON that is not finite (its text is the message)."""


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent, as a float; raises `_NotFinite` for 1e400."""
    number = float(text)
    if not math.isfinite(number):
        raise _NotFinite(text if len(text) <= 24 else f"{text[:12]}…{text[-8:]}")
    return number


def _no_constant(text: str) -> float:
    """JSON's NaN, Infinity and -Infinity (Python's extension, not JSON): raises `_NotFinite`."""
    raise _NotFinite(text)


class _RepeatedKey(ValueError):
    """A key the call's JSON gives twice in one object (the message names it, escaped and cut:
    a lone surrogate or a long key stays out of the error call)."""

    def __init__(self, key: str) -> None:
        shown = key if len(key) <= KEY_SHOWN_CHARS else f"{key[:KEY_SHOWN_CHARS]}…"
        super().__init__(f"repeats the key {shown!r} in one object; give each key once")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; raises `_RepeatedKey` for a key given twice."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _RepeatedKey(key)
        value[key] = item
    return value


def _decoder() -> json.JSONDecoder:
    """The JSON decoder of calls: raw newlines and tabs in strings taken (`strict=False`), a
    number that is not finite refused (`_NotFinite`), a key repeated in one object refused
    (`_RepeatedKey`)."""
    return json.JSONDecoder(
        strict=False,
        parse_float=_finite,
        parse_constant=_no_constant,
        object_pairs_hook=_unique_keys,
    )


def _not_unicode(value: Any) -> bool:
    """Whether a string in `value` (a JSON value: keys included, at any depth) holds a lone
    surrogate, which no UTF-8 (and so no payload, file or command) can carry. A JSON pair of
    escapes decodes to the one character it encodes; a surrogate left in a `str` is lone."""
    stack = [value]
    while stack:  # no recursion: the value may nest as deep as the decoder read
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return False


def _json_problem(exc: json.JSONDecodeError) -> str:
    """What the decoder found, and where in the JSON: its "at" (a position it appends) dropped."""
    return f"{re.sub(r'( starting)? at$', '', exc.msg)} (position {exc.pos})"


def _cut(tokens: int, problem: str) -> ToolCall:
    """The error of a turn its token limit ended before its call was whole."""
    return _error(
        f"the turn ran out of its {tokens} tokens before the call was complete ({problem}). "
        f"{CUT_ADVICE}"
    )


def full_call(
    call: ToolCall, text: str, tools: Sequence[ToolSpec], *, thinking: bool = False
) -> ToolCall:
    """The call whose brief `call` is: `call` itself where nothing was cut, else the turn's
    `text` parsed again, as it was parsed (`thinking`: its `CompletionRecord.thinking`; false
    also where the record predates it, whose readings follow: the module's docstring). Raises
    ValueError when `text` does not parse to a call with that brief (the text of another
    turn)."""
    if not call.cut:
        return call
    readings = [lambda: tags(text, thinking)]
    if not thinking:
        readings += [lambda: tags(text, True), lambda: tags_before_the_flag(text)]
    for found in readings:
        whole = _parsed(text, list(found()), tools, None)
        if whole.brief() == call:
            return whole
    raise ValueError("the turn's text does not parse to the call whose brief came with it")


def _check_arguments(tool: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """What is wrong with `arguments` under the tool's (flat) JSON schema, or None; a value of
    no scalar type nests at most `MAX_DEPTH` levels."""
    properties: dict[str, Any] = tool.parameters.get("properties", {})
    missing = [key for key in tool.parameters.get("required", []) if key not in arguments]
    if missing:
        return "missing " + ", ".join(repr(key) for key in missing)
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        expected = ", ".join(repr(key) for key in properties) or "none"
        return f"unexpected {', '.join(repr(k) for k in unknown)} (expected: {expected})"
    types: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
    }
    for key, value in arguments.items():
        kind = properties[key].get("type")
        if kind in types and (
            # a JSON true is no integer or number, though Python's bool is an int
            not isinstance(value, types[kind]) or (isinstance(value, bool) and kind != "boolean")
        ):
            article = "an" if kind == "integer" else "a"
            return f"{key!r} must be {article} {kind}"
        if _nests_deeper(value, MAX_DEPTH):
            return f"{key!r} nests deeper than {MAX_DEPTH} levels"
    return None


def _nests_deeper(value: Any, levels: int) -> bool:
    """Whether `value` nests lists or objects more than `levels` deep (recursing `levels` at most)."""
    if not isinstance(value, dict | list):
        return False
    children = value.values() if isinstance(value, dict) else value
    return levels <= 0 or any(_nests_deeper(child, levels - 1) for child in children)


def _error(why: str, name: str = "", arguments: dict[str, Any] | None = None) -> ToolCall:
    """An error call; the model's `arguments` kept only when flat and small (else `why` says so)."""
    if arguments and not (
        all(isinstance(value, SCALARS) for value in arguments.values())
        and len(json.dumps(arguments)) <= MAX_KEPT_CHARS
    ):
        why = f"{why} (arguments not kept: nested values or over {MAX_KEPT_CHARS} characters)"
        arguments = None
    return ToolCall(name=name, arguments=arguments or {}, error=why)
