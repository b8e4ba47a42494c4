"""Docker's reading of a Dockerfile's words (`infra/tasks/harbor_dockerfile.py`): an
instruction's arguments split as a shell would (a JSON array too), ENV's `KEY=value` words and
variables expanded from what earlier lines set over the sandbox's `BASE_ENV`.

    arguments_of('["a b", "$C"]', env, fail)   # ["a b", env's C]: COPY's words, expanded
    env_pairs('A=1 B="$A 2"', {}, fail)        # {"A": "1", "B": " 2"}: not from the same line
    shell_words("'$HOME' x", env, fail)        # ["$HOME", "x"]
    shell_words("${A:-/srv}", {}, fail)        # ["/srv"]

The variables are Docker's (its shell lexer): `$VAR`, `${VAR}`, and `${VAR:-word}` (word where
VAR is unset or empty), `${VAR-word}` (where unset), `${VAR:+word}` (word where VAR is set and
not empty, else empty), `${VAR+word}` (where set), the word itself read as a word is (quotes,
escapes, variables). Any other `${` (`${VAR:?msg}`, `${VAR#pattern}`, an unclosed one) is the
caller's error: it was once taken as literal text (`ENV A=${B:+x}` loaded as '${B:+x}').

`fail(why)` makes the caller's error (the file and line): an unclosed quote, an ENV word that
is no `KEY=value`, a `${` this reader does not take.
"""

from __future__ import annotations

import json
import re
from typing import Any

from infra.sandbox.workspace import BASE_ENV

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A variable name a task may set (a Dockerfile's ENV, task.toml's [verifier.env])."""
_NAME = re.compile(r"\w+")
MAX_NESTING = 32
"""How deep one `${VAR:-word}` may hold another in its word (a Dockerfile of nested `${` ran
out of Python's stack)."""


def arguments_of(arguments: str, env: dict[str, str], fail: Any) -> list[str]:
    """COPY's words: a JSON array's strings with `$VAR`/`${VAR}` expanded, else the words of
    `shell_words` (quotes removed, expanded except in single quotes: `'$D'` is `$D`)."""
    if arguments.startswith("["):
        try:
            words = json.loads(arguments)
        except ValueError:
            words = None
        if isinstance(words, list) and all(isinstance(word, str) for word in words):
            return [expand(word, env, fail) for word in words]
    return shell_words(arguments, env, fail)


def expand(text: str, env: dict[str, str], fail: Any) -> str:
    """`text` with its variables expanded (`_dollar`), nothing else of it read (a JSON array's
    word: no quotes, no escapes)."""
    scope, out, i = {**BASE_ENV, **env}, [], 0
    while (at := text.find("$", i)) >= 0:
        value, after = _dollar(text, at, scope, fail, 0)
        out += [text[i:at], value]
        i = after
    return "".join([*out, text[i:]])


def env_pairs(arguments: str, env: dict[str, str], fail: Any) -> dict[str, str]:
    first, *rest = re.split(r"\s+", arguments.strip(), maxsplit=1)
    if not first:
        raise fail("ENV needs KEY=value")
    if "=" not in first:  # the legacy form: ENV KEY value with spaces
        whole = shell_words(rest[0] if rest else "", env, fail, split=False)
        if not ENV_KEY.fullmatch(first) or not whole:
            raise fail(f"ENV {arguments!r} is neither KEY=value nor KEY value")
        return {first: whole[0]}
    pairs: dict[str, str] = {}
    for word in shell_words(arguments, env, fail):
        key, equals, value = word.partition("=")
        if not equals or not ENV_KEY.fullmatch(key):
            raise fail(f"ENV {word!r} is not KEY=value")
        pairs[key] = value  # as Docker: expanded from what the lines before set, not this one
    return pairs


def shell_words(text: str, env: dict[str, str], fail: Any, split: bool = True) -> list[str]:
    """Docker's processing of ENV words: quotes removed, variables expanded (`_dollar`) except
    in single quotes, a backslash escapes the next character (in double quotes only `"`, `$`
    and a backslash); words split at unquoted whitespace unless `split` is false."""
    words, _ = _scan(text, 0, {**BASE_ENV, **env}, fail, split, "", 0)
    return words


def _scan(
    text: str, i: int, scope: dict[str, str], fail: Any, split: bool, stop: str, depth: int
) -> tuple[list[str], int]:
    """`shell_words` of `text` from `i` (the words, and where they end): to its end, or to the
    first unquoted `stop` (a `${VAR:-word}`'s `}`: the index after it), which must come."""
    words: list[str] = []
    word: list[str] | None = None  # None: between words
    quote = ""
    while i < len(text):
        char = text[i]
        if stop and char == stop and not quote:
            return (words if word is None else [*words, "".join(word)]), i + 1
        if char.isspace() and split and not quote:
            if word is not None:
                words.append("".join(word))
            word, i = None, i + 1
            continue
        word = [] if word is None else word
        if char == "$" and quote != "'":
            value, i = _dollar(text, i, scope, fail, depth)
            word.append(value)
            continue
        escapes = quote == "" or (quote == '"' and text[i + 1 : i + 2] in ('"', "$", "\\"))
        if char == "\\" and quote != "'" and escapes and i + 1 < len(text):
            word.append(text[i + 1])
            i += 2
            continue
        if char == quote:
            quote = ""
        elif char in "'\"" and not quote:
            quote = char
        else:
            word.append(char)
        i += 1
    if quote:
        raise fail(f"no closing quotation in {text!r}")
    if stop:
        raise fail(f"a '${{' without its closing '{stop}' in {text!r}")
    return (words if word is None else [*words, "".join(word)]), i


def _dollar(text: str, i: int, scope: dict[str, str], fail: Any, depth: int) -> tuple[str, int]:
    """The value of the variable at `text[i]` (a `$`) as Docker expands it, and the index after
    it: `$VAR`, `${VAR}`, `${VAR:-word}`, `${VAR-word}`, `${VAR:+word}`, `${VAR+word}` (an unset
    VAR is empty); a `$` that starts no name is itself. `fail` for any other `${`."""
    if text[i + 1 : i + 2] != "{":
        name = _NAME.match(text, i + 1)
        return (scope.get(name.group(), ""), name.end()) if name else ("$", i + 1)
    name = _NAME.match(text, i + 2)
    after = name.end() if name else i + 2
    if name and text[after : after + 1] == "}":
        return scope.get(name.group(), ""), after + 1
    colon = text[after : after + 1] == ":"
    modifier = text[after + colon : after + colon + 1]
    if not name or modifier not in ("-", "+") or depth >= MAX_NESTING:
        shown = text[i : i + 40] + ("…" if len(text) > i + 40 else "")
        why = f"nested more than {MAX_NESTING} deep" if depth >= MAX_NESTING else "not read"
        raise fail(
            f"{shown!r}: a '${{' this loader does not take ({why}: only ${{VAR}}, ${{VAR:-word}}, "
            "${VAR-word}, ${VAR:+word} and ${VAR+word})"
        )
    words, end = _scan(text, after + colon + 1, scope, fail, False, "}", depth + 1)
    word, value = "".join(words), scope.get(name.group())
    unset = value is None or (colon and not value)
    if modifier == "-":
        return (word if unset else value or ""), end
    return ("" if unset else word), end
