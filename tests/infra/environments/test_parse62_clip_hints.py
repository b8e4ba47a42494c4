"""The clip's note on a `read_file` result names a way to read what it left out that comes back
whole (on real bwrap: the hinted command is run in the session's shell and its result clipped).

Before, where the part left out lay inside lines longer than the clip, the note named exactly
those lines (`sed -n '1,1p' m.js` for a 9,000-character one-line file, `sed -n '1,3p'` for a
file of three ~3 KB lines: the whole file), which came back clipped the same way: a model that
did as told read the same cut again, and again. A range of short lines too long for one result
came back from `sed` as plain characters, with no line named."""

from __future__ import annotations

import re
from typing import Any

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from infra.inference.untrusted import clip
from tests.infra.environments.conftest import Rig, needs_root

LIMITS = SandboxLimits(timeout_s=5)
HINT = re.compile(
    r"\n\[\.\.\. (\d+) characters left out: [^\n]*?read them with bash: ([^\n]*) \.\.\.\]\n"
)


def numbered(prefix: str, chars: int) -> str:
    """A line of about `chars` characters, none of its stretches repeated (`é` two bytes)."""
    return "".join(f"{prefix}é{i:05d}," for i in range(chars // (len(prefix) + 7) + 1))


FILES = {
    "m.js": numbered("y", 9000),  # one line far over the clip
    "b.txt": "\n".join(numbered(c, 3000) for c in "abc"),  # three lines, each over half of it
    "a.py": "".join(f"line {i:04d} " + "x" * 40 + "\n" for i in range(1, 201)),  # 200 short
    "mixed.txt": numbered("s", 1000) + "\n" + numbered("L", 9000) + "\n" + numbered("t", 1000),
}


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize("by_tokens", [False, True], ids=["chars", "tokens"])
async def test_the_clips_hint_reads_what_it_left_out_in_a_result_that_comes_back_whole(
    rig: Rig, by_tokens: bool
) -> None:
    # a byte tokenizer (`é` is two): its budget binds before the characters'
    count: Any = (lambda text: len(text.encode())) if by_tokens else None
    state = await rig.env.reset(rig.spec(FILES), "s0")
    for path, content in FILES.items():
        _, seen = await rig.env.step(
            state, ToolCall(name="read_file", arguments={"path": path}), LIMITS
        )
        shown = clip(seen.text, count_tokens=count)
        note = HINT.search(shown)
        assert note, shown
        left, command = int(note[1]), note[2]
        tail = shown[note.end() :]
        header = seen.text.index("\n") + 1
        start = len(seen.text) - left - len(tail) - header  # the file's first character left out
        assert 0 <= start < len(content)
        _, result = await rig.env.step(
            state, ToolCall(name="bash", arguments={"command": command}), LIMITS
        )
        assert result.text.startswith("exit code: 0\nstdout:\n"), (path, command, result.text)
        # it comes back whole: not cut again the same way
        assert clip(result.text, count_tokens=count) == result.text, (path, command)
        read = result.text.removeprefix("exit code: 0\nstdout:\n")
        at = content.find(read)
        # what it shows is the file's, and it goes on from where the shown head stopped
        assert 0 <= at <= start < at + len(read), (path, command, at, start, len(read))
