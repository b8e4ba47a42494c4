"""A workspace restored from its snapshot (a lost worker, a retried step) and the verifier's copy
are the workspace the agent saw: modes, hard links, links, empty directories. Real bwrap, as
root.

Before, a restore wrote files 0644 or 0755 and directories 0755, and each hard link as a file
of its own; a step that only changed a mode stored no snapshot, so an agent's `chmod 600` was
graded as if it had not run (a score of 0 for correct work)."""

from __future__ import annotations

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=10)
LIST = (
    "find . -mindepth 1 | sort | while read p; do stat -c '%n %a %F %h %i' \"$p\"; "
    '[ -L "$p" ] && readlink "$p"; done'
)
"""Each path's mode, kind and link count, and its inode (shared by hard links)."""
CHANGES = (
    "rm gone.txt; mkdir -p empty/nested; mkdir -m 700 private; chmod 600 keep.txt; "
    "echo ro > ro.txt; chmod 444 ro.txt; echo x > onlyu.sh; chmod 700 onlyu.sh; "
    "ln -s keep.txt rel; ln -s missing dangling; ln keep.txt hard; ln sub/a.txt sub/b.txt; "
    "chmod 555 sub; chmod 1777 empty; chmod 0 empty/nested"
)


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


def inodes_numbered(listing: str) -> list[str]:
    """The listing with inode numbers replaced by the order they first appear in."""
    numbers: dict[str, str] = {}
    lines = []
    for line in listing.splitlines():
        *rest, inode = line.split(" ")
        if rest and inode.isdigit():
            line = " ".join([*rest, numbers.setdefault(inode, str(len(numbers)))])
        lines.append(line)
    return lines


async def test_a_restored_workspace_is_the_one_the_agent_saw(rig: Rig) -> None:
    spec = rig.spec({"keep.txt": "k\n", "gone.txt": "g\n", "sub/a.txt": "a\n"})
    state = await rig.env.reset(spec, "live")
    state, seen = await rig.env.step(state, bash(CHANGES), LIMITS, 1)
    assert seen.text == "exit code: 0", seen.text
    _, live = await rig.env.step(state, bash(LIST), LIMITS, 2)
    restored = await rig.env.reset(spec, "restored", state.snapshot)
    assert restored.tree_digest == state.tree_digest
    _, again = await rig.env.step(restored, bash(LIST), LIMITS, 2)
    assert inodes_numbered(again.text) == inodes_numbered(live.text)
    files = dict(line.split(" ", 1) for line in inodes_numbered(live.text) if line[:2] == "./")
    assert files["./keep.txt"] == files["./hard"] and files["./hard"].startswith("600 regular")


async def test_a_mode_the_agent_set_is_the_mode_the_verifier_checks(rig: Rig) -> None:
    check = (
        'm=$(stat -c %a /app/secret); echo "mode $m"; '
        '[ "$m" = 600 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'
    )
    spec = rig.spec({"secret": "k\n"}, {"test.sh": check})
    state = await rig.env.reset(spec, "s0")
    after, seen = await rig.env.step(state, bash("chmod 600 secret; stat -c %a secret"), LIMITS, 1)
    assert seen.text == "exit code: 0\nstdout:\n600"
    assert after.snapshot != state.snapshot and after.tree_digest != state.tree_digest
    graded = await rig.env.verify(spec, after, LIMITS)
    assert graded.score == 1.0, graded.result
