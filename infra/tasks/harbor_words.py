"""Docker's reading of a Dockerfile's words (`infra/tasks/harbor_dockerfile.py`): an
instruction's arguments split as a shell would (a JSON array too), ENV's `KEY=value` words and
`$VAR`/`${VAR}` expanded from what earlier lines set over the sandbox's `BASE_ENV`.

    arguments_of('["a b", "$C"]', env, fail)   # ["a b", env's C]: COPY's words, expanded
    env_pairs('A=1 B="$A 2"', {}, fail)        # {"A": "1", "B": " 2"}: not from the same line
    shell_words("'$HOME' x", env, fail)        # ["$HOME", "x"]

`fail(why)` makes the caller's error (the file and line): an unclosed quote, an ENV word that
is no `KEY=value`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from infra.sandbox.workspace import BASE_ENV

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A variable name a task may set (a Dockerfile's ENV, task.toml's [verifier.env])."""
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def arguments_of(arguments: str, env: dict[str, str], fail: Any) -> list[str]:
    """COPY's words: a JSON array's strings with `$VAR`/`${VAR}` expanded, else the words of
    `shell_words` (quotes removed, expanded except in single quotes: `'$D'` is `$D`)."""
    if arguments.startswith("["):
        try:
            words = json.loads(arguments)
        except ValueError:
            words = None
        if isinstance(words, list) and all(isinstance(word, str) for word in words):
            return [expand(word, env) for word in words]
    return shell_words(arguments, env, fail)


def expand(text: str, env: dict[str, str]) -> str:
    scope = {**BASE_ENV, **env}
    return _VARIABLE.sub(lambda m: scope.get(m.group(1) or m.group(2), ""), text)


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
    """Docker's processing of ENV words: quotes removed, `$VAR` and `${VAR}` expanded except in
    single quotes, a backslash escapes the next character (in double quotes only `"`, `$` and
    a backslash); words split at unquoted whitespace unless `split` is false."""
    scope = {**BASE_ENV, **env}
    words: list[str] = []
    word: list[str] | None = None  # None: between words
    quote, i = "", 0
    while i < len(text):
        char = text[i]
        if char.isspace() and split and not quote:
            if word is not None:
                words.append("".join(word))
            word, i = None, i + 1
            continue
        word = [] if word is None else word
        variable = _VARIABLE.match(text, i) if char == "$" and quote != "'" else None
        if variable:
            word.append(scope.get(variable.group(1) or variable.group(2), ""))
            i = variable.end()
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
    return words if word is None else [*words, "".join(word)]
