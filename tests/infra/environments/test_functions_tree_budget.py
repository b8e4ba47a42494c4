"""A functions check's data files within its budget, on real bwrap: VCS and cache directories
(.git, __pycache__, …) are never copied, the other files go smallest first, and what is left
out is named in the verdict. Before, files went in path order: a repository's .git/objects
filled the 8 MiB and the words.txt a correct module reads at import was dropped
(FileNotFoundError, scored 0, no word of it)."""

from __future__ import annotations

import json
import os

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import program_files
from infra.environments.functions_files import MAX_PROGRAM_BYTES, MAX_PROGRAM_FILE
from infra.environments.tree import File, Packed, decode_tree, pack_files
from infra.environments.workspace import WorkspaceState
from tests.infra.environments.conftest import Rig, needs_root
from tests.infra.environments.test_workspace import FILES, FUNCTIONS, HIDDEN

LIMITS = SandboxLimits(timeout_s=10)
READS_WORDS = (  # a correct module that reads its data at import
    "WORDS = open('words.txt').read().split()\n"
    "def add(a, b):\n    return a + b if WORDS == ['one', 'two'] else None\n"
)
MB = 1_000_000


def _blobs(prefix: str, count: int) -> dict[str, File | bytes | str]:
    return {f"{prefix}{n:02d}": os.urandom(MB) for n in range(count)}


def _filling(prefix: str) -> dict[str, File | bytes | str]:
    """Files of up to 1 MiB that, beside calc.py, leave 5 bytes of the budget (names counted as
    `program_cost` counts them): no room for words.txt after them."""

    def cost(path: str, size: int) -> int:
        return size + len(json.dumps({path: ""}))

    room = MAX_PROGRAM_BYTES - cost("calc.py", len(READS_WORDS))
    blobs: dict[str, File | bytes | str] = {}
    while room > 5:
        path = f"{prefix}{len(blobs):02d}"
        size = min(MAX_PROGRAM_FILE, room - 5 - cost(path, 0))
        blobs[path], room = os.urandom(size), room - cost(path, size)
    return blobs


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize("cache", [".git/objects/", "__pycache__/", "node_modules/x/"])
async def test_a_repository_or_cache_does_not_crowd_out_the_data_a_module_reads(
    rig: Rig, cache: str
) -> None:
    spec = rig.spec(FILES, HIDDEN, FUNCTIONS)
    final = rig.add(
        pack_files({"calc.py": READS_WORDS, "words.txt": "one two\n", **_filling(cache)})
    )
    graded = await rig.env.verify(spec, WorkspaceState("gone", final.ref), LIMITS)
    assert graded.result.status is ExecStatus.PASSED and graded.score == 1.0, graded.result


@needs_root
@pytest.mark.asyncio
async def test_data_files_past_the_budget_are_named_in_the_verdict(rig: Rig) -> None:
    """Nine 1 MB files sorted before words.txt: the small one is copied, the ones past the 8 MiB
    are named (their count and the first of them)."""
    spec = rig.spec(FILES, HIDDEN, FUNCTIONS)
    final = rig.add(
        pack_files({"calc.py": READS_WORDS, "words.txt": "one two\n", **_blobs("data/b", 9)})
    )
    graded = await rig.env.verify(spec, WorkspaceState("gone", final.ref), LIMITS)
    assert graded.result.status is ExecStatus.PASSED and graded.score == 1.0, graded.result
    assert "1 file past the 8 MiB" in graded.result.detail, graded.result.detail
    assert "data/b08" in graded.result.detail, graded.result.detail


def test_nothing_left_out_says_nothing_and_skipped_directories_are_counted() -> None:
    tree = pack_files({"calc.py": READS_WORDS, "words.txt": "one two\n"})
    copied = program_files(tree.manifest, _contents(tree))
    assert not isinstance(copied, str)
    assert set(copied.files) == {"calc.py", "words.txt"} and copied.left_out == ""
    cached: dict[str, File | bytes | str] = {
        ".git/HEAD": "ref\n",
        "a/__pycache__/m.cpython-312.pyc": b"\0",
        ".venv/x.py": "#",
    }
    tree = pack_files({"calc.py": READS_WORDS, **cached})
    copied = program_files(tree.manifest, _contents(tree))
    assert not isinstance(copied, str)
    assert set(copied.files) == {"calc.py"}
    assert "3 files in VCS and cache directories" in copied.left_out, copied.left_out


def _contents(tree: Packed) -> dict[str, bytes]:
    return decode_tree(tree.objects[tree.ref.key])[1]
