"""`read_file` of a file longer than an observation shows (on real bwrap, clipped by SmolLM2's
tokenizer as the prompt does): the clip keeps whole lines and names the lines it left out with
the call that shows them, so a model never has to write back a file it saw only in part;
`read_file` reads a range of lines, says which, and cuts at `output_bytes` on a line's end.

Before, a 7,780-character file came back as its first and last 2,000 characters around
`[... 3780 characters left out ...]`, with no way to read the middle by `read_file`."""

from __future__ import annotations

import re
from typing import Any

import pytest

from contracts.episode import WORKSPACE_TOOLS, ToolCall, ToolSpec, read_lines_hint
from contracts.task import SandboxLimits
from infra.base_models import materialize_base_model
from infra.environments.file_tools import read_file
from infra.inference.untrusted import UntrustedText, clip
from infra.settings import Settings
from tests.infra.environments.conftest import Rig, needs_root
from tests.paths import REPO_ROOT

LIMITS = SandboxLimits(timeout_s=5)
SOURCE = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(250))  # 7,780 chars
LINES = SOURCE.splitlines(keepends=True)  # 500
NOTE = re.compile(r"\n\[\.\.\. \d+ characters left out: lines (\d+)-(\d+); ([^\n]*) \.\.\.\]\n")


@pytest.fixture(scope="module")
def count() -> Any:
    """SmolLM2's count of untrusted tokens, as `ChatFormat` clips an observation with."""
    from transformers import AutoTokenizer

    model = materialize_base_model("smollm2", Settings(home=REPO_ROOT / ".tempered"))
    return UntrustedText(AutoTokenizer.from_pretrained(str(model))).count


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


@needs_root
@pytest.mark.asyncio
async def test_a_long_file_read_whole_is_clipped_at_lines_it_names_with_how_to_read_them(
    rig: Rig, count: Any
) -> None:
    state = await rig.env.reset(rig.spec({"big.py": SOURCE}), "s0")
    _, seen = await rig.env.step(state, call("read_file", path="big.py"), LIMITS)
    assert seen.text == f"[big.py: lines 1-500 of 500]\n{SOURCE}"
    shown = clip(seen.text, count_tokens=count)
    note = NOTE.search(shown)
    assert note, shown
    first, last = int(note[1]), int(note[2])
    # the hint names the first of those lines one result holds (all of them would come back
    # clipped again: tests/infra/environments/test_parse62_clip_hints.py)
    fits = re.fullmatch(rf"one result holds lines {first}-(\d+): (.*)", note[3])
    assert fits, note[3]
    upto = int(fits[1])
    assert first < upto < last and fits[2] == read_lines_hint("big.py", first, upto)
    head, tail = shown[: note.start()], shown[note.end() :]
    # whole lines on both sides of the note, and together with the lines named, the file
    assert head == "[big.py: lines 1-500 of 500]\n" + "".join(LINES[: first - 1]).rstrip("\n")
    assert tail == "".join(LINES[last:])
    _, middle = await rig.env.step(
        state, call("bash", command=f"sed -n '{first},{upto}p' big.py"), LIMITS
    )
    assert middle.text == "exit code: 0\nstdout:\n" + "".join(LINES[first - 1 : upto]).rstrip("\n")
    assert clip(middle.text, count_tokens=count) == middle.text  # it comes back whole
    ranged = read_file(rig.host.sessions["s0"], "big.py", LIMITS, first, last)
    assert ranged.text == f"[big.py: lines {first}-{last} of 500]\n" + "".join(
        LINES[first - 1 : last]
    )
    # a range clipped in turn: the lines named are the file's
    shown = clip(ranged.text, count_tokens=count)
    note = NOTE.search(shown)
    assert note, shown
    lo, hi = int(note[1]), int(note[2])
    again = re.fullmatch(rf"one result holds lines {lo}-(\d+): (.*)", note[3])
    assert first < lo <= hi < last and again, note[3]
    assert lo < int(again[1]) < hi and again[2] == read_lines_hint("big.py", lo, int(again[1]))
    assert shown[: note.start()].endswith("".join(LINES[first - 1 : lo - 1]).rstrip("\n"))
    assert shown[note.end() :] == "".join(LINES[hi:last])


@needs_root
@pytest.mark.asyncio
async def test_read_file_reads_a_range_of_lines_and_refuses_a_bad_one(rig: Rig) -> None:
    files = {"big.py": SOURCE, "short.txt": "one\ntwo\nthree", "empty.txt": ""}
    await rig.env.reset(rig.spec(files), "s0")
    session = rig.host.sessions["s0"]
    assert read_file(session, "big.py", LIMITS, 3, 4).text == (
        "[big.py: lines 3-4 of 500]\ndef f1(x):\n    return x + 1\n"
    )
    assert read_file(session, "big.py", LIMITS, 499).text == (
        "[big.py: lines 499-500 of 500]\ndef f249(x):\n    return x + 249\n"
    )
    assert read_file(session, "short.txt", LIMITS, 2, 99).text == (
        "[short.txt: lines 2-3 of 3]\ntwo\nthree"  # an end past the file's: to its end
    )
    assert (
        read_file(session, "short.txt", LIMITS, end_line=1).text
        == "[short.txt: lines 1-1 of 3]\none\n"
    )
    assert read_file(session, "short.txt", LIMITS).text == "one\ntwo\nthree"  # short, whole: as is
    assert read_file(session, "empty.txt", LIMITS, 1).text == ""
    for start, end, error in [
        (0, None, "error: start_line must be a whole number from 1"),
        (None, -2, "error: end_line must be a whole number from 1"),
        (True, None, "error: start_line must be a whole number from 1"),
        ("2", None, "error: start_line must be a whole number from 1"),
        (5, 4, "error: end_line 4 is before start_line 5"),
        (4, None, "error: short.txt has 3 lines: start_line 4 is past its end"),
    ]:
        seen = read_file(session, "short.txt", LIMITS, start, end)  # type: ignore[arg-type]
        assert seen.text == error
    assert read_file(session, "empty.txt", LIMITS, 2).text == (
        "error: empty.txt has 0 lines: start_line 2 is past its end"
    )


@needs_root
@pytest.mark.asyncio
async def test_read_file_cuts_at_the_output_limit_on_a_lines_end_and_names_the_rest(
    rig: Rig,
) -> None:
    limits = LIMITS.model_copy(update={"output_bytes": 1000})
    state = await rig.env.reset(rig.spec({"big.py": SOURCE}), "s0")
    _, seen = await rig.env.step(state, call("read_file", path="big.py"), limits)
    kept = 0
    while len("".join(LINES[: kept + 1]).encode()) <= 1000:
        kept += 1
    assert seen.text == (
        f"[big.py: lines 1-{kept} of 500]\n"
        + "".join(LINES[:kept])
        + f"(cut at 1000 bytes: lines {kept + 1}-500 not shown; "
        + read_lines_hint("big.py", kept + 1, 500)
        + ")"
    )
    session = rig.host.sessions["s0"]
    assert read_file(session, "big.py", limits, 400, 401).text == (
        "[big.py: lines 400-401 of 500]\n" + "".join(LINES[399:401])
    )


def test_the_hint_is_a_read_file_call_once_its_schema_takes_start_line() -> None:
    assert read_lines_hint("a b.py", 3, 9) == "read them with bash: sed -n '3,9p' 'a b.py'"
    ranged = ToolSpec(
        name="read_file",
        description="Read a text file.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer"},
                "end_line": {"type": "integer"},
            },
            "required": ["path"],
        },
    )
    tools = (*[t for t in WORKSPACE_TOOLS if t.name != "read_file"], ranged)
    assert read_lines_hint("a b.py", 3, 9, tools) == (
        'read them with read_file: {"path": "a b.py", "start_line": 3, "end_line": 9}'
    )
