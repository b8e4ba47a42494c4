"""The `workspace` environment on real bwrap: each tool, errors as observations (never
crashes), paths kept inside the workspace, snapshots after steps, a retried step run from its
state, and both kinds of checks in a fresh sandbox."""

from __future__ import annotations

import errno
import os

import pytest

from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import InvalidTask
from infra.environments.mounts import mounts_under
from infra.environments.tree import Check, TreeError
from infra.environments.workspace import UNKEPT_WHY, SessionLost, WorkspaceState
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=5)
FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "README.md": "add(a, b) is a + b\n"}
FUNCTIONS = Check(kind="functions", tests="hidden.py", modules=["calc"])
HIDDEN = {"hidden.py": "assert add(1, 2) == 3\nassert add(2, 2) == 4\nassert add(0, 0) == 0\n"}


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


async def test_each_tool(rig: Rig) -> None:
    spec = rig.spec(FILES)
    state = await rig.env.reset(spec, "s0")
    state, seen = await rig.env.step(
        state, call("bash", command="ls; echo oops >&2; exit 4"), LIMITS
    )
    assert seen.status is ExecStatus.FAILED
    assert seen.text == "exit code: 4\nstdout:\nREADME.md\ncalc.py\nstderr:\noops"
    state, seen = await rig.env.step(state, call("read_file", path="/app/calc.py"), LIMITS)
    assert seen.text == FILES["calc.py"] and seen.status is None
    before = state.tree_digest
    state, seen = await rig.env.step(
        state, call("write_file", path="pkg/new.py", content="x = 1\n"), LIMITS
    )
    assert seen.text == "wrote 6 bytes to pkg/new.py" and state.tree_digest != before
    workspace = rig.host.sessions["s0"].workspace
    assert (workspace / "pkg" / "new.py").stat().st_uid == rig.host.sessions["s0"].uid
    state, seen = await rig.env.step(state, call("bash", command="cat pkg/new.py"), LIMITS)
    assert "x = 1" in seen.text
    state, seen = await rig.env.step(state, call("submit"), LIMITS)
    assert seen.submitted


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (ToolCall(error="no <tool_call> in the turn"), "error: no <tool_call> in the turn"),
        (call("rm_rf"), "there is no tool 'rm_rf'"),
        (call("bash"), "bash needs the argument(s) command"),
        (call("bash", command="ls", cwd="/"), "bash takes no argument(s) cwd"),
        (call("read_file", path=7), "path must be a string"),
        (call("read_file", path="../../etc/passwd"), "outside the workspace"),
        (call("read_file", path="/etc/passwd"), "outside the workspace"),
        (call("write_file", path="/usr/lib/x", content=""), "outside the workspace"),
        (call("read_file", path="out/passwd"), "outside the workspace"),  # out -> /etc
        (call("write_file", path="up/x", content="x"), "outside the workspace"),  # up -> ..
        (call("read_file", path="missing.txt"), "no such file"),
        (call("read_file", path="."), "is a directory"),
        (call("read_file", path="calc.py/x"), "is not a directory"),
        (call("read_file", path="x" * 300), "File name too long"),  # a model's long path
        (call("write_file", path="d/" + "y" * 300, content=""), "File name too long"),
        (call("read_file", path="a/" * 2100), "File name too long"),  # past PATH_MAX
        (call("write_file", path="u.txt", content="\ud83d"), "not valid Unicode"),  # JSON "\\ud83d"
        (call("read_file", path="\ud83d.txt"), "not valid Unicode"),
        (call("bash", command="echo \ud83d"), "not valid Unicode"),
        (call("bash", command="echo " + "x" * 200_000), "longer than 65536 bytes"),
        (call("bash", command="echo a\0b"), "command holds a NUL"),  # a ValueError, retried
        (call("read_file", path="a\0.txt"), "path holds a NUL"),
        (call("write_file", path="a\0.txt", content="x"), "path holds a NUL"),
        (call("write_file", path="pipe", content="x"), "pipe is not a file"),  # no wait for good
        (call("read_file", path="pipe"), "pipe is not a file"),
        (call("write_file", path="via/x.py", content="x"), "no such directory 'gone'"),  # gone/..
    ],
)
async def test_bad_calls_are_error_observations(rig: Rig, action: ToolCall, error: str) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, made = await rig.env.step(
        state,
        call("bash", command="ln -s /etc out; ln -s .. up; mkfifo pipe; ln -s gone/../d via"),
        LIMITS,
    )
    assert made.text.endswith("note: removed pipe: " + UNKEPT_WHY), made.text
    os.mkfifo(rig.host.sessions["s0"].workspace / "pipe")  # as if its step's scan missed it
    after, seen = await rig.env.step(state, action, LIMITS)
    assert error in seen.text and seen.status is None and not seen.submitted
    assert after.tree_digest == state.tree_digest


async def test_a_link_whose_target_is_not_utf8_is_left_out_of_the_snapshot(rig: Rig) -> None:
    """As a name that is not UTF-8 is: no manifest can hold it (once a failure on every retry
    of the step, the link being restored each time)."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, seen = await rig.env.step(
        state, call("bash", command="ln -s \"$(printf '\\377')\" bad && ln -s calc.py good"), LIMITS
    )
    assert seen.text.startswith("exit code: 0"), seen.text
    entries = rig.trees.get_manifest(state.snapshot).entries
    assert {e.path: e.target for e in entries if e.kind == "link"} == {"good": "calc.py"}


async def test_a_step_that_nests_too_deep_is_undone_and_told(rig: Rig) -> None:
    """Once a RecursionError in the snapshot's scan: retried without end, the step rerun each time."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    # one mkdir, not 1,200 (one a level took the 5 s deadline on a loaded machine)
    command = "mkdir -p \"$(printf 'd/%.0s' $(seq 1200))\" && echo deep"
    after, seen = await rig.env.step(state, call("bash", command=command), LIMITS)
    assert seen.text.startswith("exit code: 0\nstdout:\ndeep"), seen.text
    assert "nests directories deeper than 256 levels; the step's changes were undone" in seen.text
    assert after.tree_digest == state.tree_digest


async def test_links_inside_the_workspace_are_followed(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, _ = await rig.env.step(
        state,
        call("bash", command="mkdir d && ln -s ../calc.py d/alias && ln -s /app/README.md abs"),
        LIMITS,
    )
    _, seen = await rig.env.step(state, call("read_file", path="d/alias"), LIMITS)
    assert seen.text == FILES["calc.py"]
    _, seen = await rig.env.step(state, call("read_file", path="abs"), LIMITS)
    assert seen.text == FILES["README.md"]


async def test_read_file_cuts_at_the_output_limit_between_characters(rig: Rig) -> None:
    limits = LIMITS.model_copy(update={"output_bytes": 256})
    files: dict[str, bytes | str] = {
        "exact.txt": "a" * 256,
        "long.txt": "b" * 257,
        "accents.txt": "a" + "é" * 200,  # the cut at byte 256 falls inside an "é" (2 bytes)
        "image.bin": b"\x89PNG\xff\xfe",
    }
    state = await rig.env.reset(rig.spec(files), "s0")
    _, seen = await rig.env.step(state, call("read_file", path="exact.txt"), limits)
    assert seen.text == "a" * 256
    _, seen = await rig.env.step(state, call("read_file", path="long.txt"), limits)
    assert seen.text == "b" * 256 + "\n(cut at 256 bytes)"
    _, seen = await rig.env.step(state, call("read_file", path="accents.txt"), limits)
    assert seen.text == "a" + "é" * 127 + "\n(cut at 256 bytes)"
    _, seen = await rig.env.step(state, call("read_file", path="image.bin"), limits)
    assert seen.text == "error: image.bin is not a UTF-8 text file" and seen.status is None


async def test_write_file_refuses_what_it_must_not_write(rig: Rig) -> None:
    limits = LIMITS.model_copy(update={"file_size_mb": 1})
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, _ = await rig.env.step(state, call("bash", command="mkdir pkg"), limits)
    for path, content, error in [
        ("big.txt", "x" * ((1 << 20) + 1), "error: the content is larger than 1 MB"),
        (".", "x", "error: . is the workspace itself"),
        ("/app", "x", "error: /app is the workspace itself"),
        ("pkg", "x", "error: pkg is a directory"),
    ]:
        after, seen = await rig.env.step(
            state, call("write_file", path=path, content=content), limits
        )
        assert seen.text == error and after == state
    _, seen = await rig.env.step(
        state, call("write_file", path="max.txt", content="x" * (1 << 20)), limits
    )
    assert seen.text == f"wrote {1 << 20} bytes to max.txt"


async def test_what_write_file_creates_the_agents_commands_can_change(rig: Rig) -> None:
    """New directories and files belong to the session's uid, as if its own commands had made
    them: the next `bash` step can write into them."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, _ = await rig.env.step(
        state, call("write_file", path="a/b/c.txt", content="c\n"), LIMITS
    )
    session = rig.host.sessions["s0"]
    for path, mode in (("a", 0o755), ("a/b", 0o755), ("a/b/c.txt", 0o644)):
        info = (session.workspace / path).lstat()
        assert (info.st_uid, info.st_mode & 0o7777) == (session.uid, mode), path
    _, seen = await rig.env.step(
        state,
        call("bash", command="echo d > a/b/d.txt && echo e >> a/b/c.txt && cat a/b/*"),
        LIMITS,
    )
    assert seen.text == "exit code: 0\nstdout:\nc\ne\nd"


async def test_a_workspace_is_a_tmpfs_no_command_writes_past(rig: Rig) -> None:
    """The disk quota: 16 files of 4 MB asked of a 2 MB workspace; each write stops at ENOSPC
    inside the sandbox, the host's disk untouched, and `write_file` is told the same."""
    assert rig.host.tmpfs  # as root: `disk = auto` mounts one
    state = await rig.env.reset(rig.spec(FILES), "s0")
    workspace = rig.host.sessions["s0"].workspace
    fill = "for i in $(seq 16); do head -c 4000000 /dev/zero > f$i; done; du -sk . | cut -f1"
    state, seen = await rig.env.step(state, call("bash", command=fill), LIMITS)
    assert "No space left on device" in seen.text
    assert int(seen.text.split("stdout:\n")[1].split("\n")[0]) <= 2048  # KiB, `du`'s
    usage = os.statvfs(workspace)
    assert usage.f_blocks * usage.f_frsize == 2 << 20 and usage.f_bavail == 0
    state, seen = await rig.env.step(
        state, call("write_file", path="more.txt", content="x"), LIMITS
    )
    assert seen.text == "error: more.txt: No space left on device"
    state, seen = await rig.env.step(state, call("bash", command="rm f*"), LIMITS)
    _, seen = await rig.env.step(state, call("write_file", path="more.txt", content="x"), LIMITS)
    assert seen.text == "wrote 1 bytes to more.txt"
    with pytest.raises(TreeError, match="does not fit a workspace.s 2 MB"):  # the task's own
        await rig.env.reset(rig.spec({"data.bin": "x" * (3 << 20)}), "s1")
    assert "s1" not in rig.host.sessions and mounts_under(rig.host.directory) == [workspace]


@pytest.mark.parametrize("rig", ["directory"], indirect=True)
async def test_limits_become_observations_and_a_too_large_workspace_is_undone(rig: Rig) -> None:
    assert not rig.host.tmpfs
    state = await rig.env.reset(rig.spec(FILES), "s0")
    _, seen = await rig.env.step(
        state, call("bash", command="sleep 30"), LIMITS.model_copy(update={"timeout_s": 1})
    )
    assert seen.status is ExecStatus.TIMEOUT and "killed" in seen.text
    after, seen = await rig.env.step(
        state, call("bash", command="head -c 3000000 /dev/zero > big"), LIMITS
    )
    assert "more than 2 MB" in seen.text and "undone" in seen.text  # the rig allows 2 MB
    assert after.tree_digest == state.tree_digest
    assert not (rig.host.sessions["s0"].workspace / "big").exists()


async def test_a_step_runs_from_the_state_it_is_given(rig: Rig) -> None:
    """A retried step whose first attempt got further (or a stale session) is run again from
    the snapshot its state names, so the outcome depends only on (state, call) (and the clock:
    the snapshots keep the times files were written)."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    append = call("bash", command="echo x >> log.txt; wc -l < log.txt")
    first, seen = await rig.env.step(state, append, LIMITS)
    again, seen_again = await rig.env.step(state, append, LIMITS)  # the same step, retried
    assert seen.text == seen_again.text == "exit code: 0\nstdout:\n1"
    assert first.tree_digest == again.tree_digest
    readme = rig.host.sessions["s0"].workspace / "README.md"
    held = os.open(readme, os.O_RDONLY)

    def same_file() -> bool:
        (was, now) = (os.fstat(held), os.stat(readme))
        return (was.st_dev, was.st_ino) == (now.st_dev, now.st_ino)

    try:  # a restore writes the tree anew: the file held open is then not the workspace's
        await rig.env.step(again, append, LIMITS)  # from the session's own state
        assert same_file()
        await rig.env.step(state, append, LIMITS)  # from an older one
        assert not same_file()
    finally:
        os.close(held)
    with pytest.raises(SessionLost):
        await rig.env.step(WorkspaceState("elsewhere", state.snapshot), append, LIMITS)


async def test_snapshots_are_skipped_when_nothing_changed(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    stored = len(rig.objects)
    after, _ = await rig.env.step(state, call("bash", command="cat calc.py"), LIMITS)
    assert after == state and len(rig.objects) == stored


async def test_functions_check_scores_the_share_of_hidden_asserts(rig: Rig) -> None:
    spec = rig.spec(FILES, HIDDEN, FUNCTIONS)
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.result.status is ExecStatus.FAILED
    assert graded.score == pytest.approx(1 / 3)  # add(0, 0) == 0 holds for a - b too
    fixed = "def add(a, b):\n    return a + b\n"
    state, _ = await rig.env.step(state, call("write_file", path="calc.py", content=fixed), LIMITS)
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.result.status is ExecStatus.PASSED and graded.score == 1.0
    assert "hidden.py" not in os.listdir(rig.host.sessions["s0"].workspace)


async def test_a_script_check_runs_as_the_workspaces_owner_not_root(rig: Rig) -> None:
    """The hidden tests run the agent's code, so they run under a sandbox uid, one that owns
    the final workspace (as the agent did), never as the worker's root."""
    script = (
        # the host's root owns /usr: were the check root, /usr would be its own
        "[ ! -O /usr ] && [ -O calc.py ] && [ -O . ] && touch made_by_tests "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    spec = rig.spec(FILES, {"test.sh": script})
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 1.0, graded.result


async def test_a_script_check_writes_within_the_verifiers_quota(rig: Rig) -> None:
    """A Harbor test script runs the agent's code over a writable workspace: in the verifier
    too it is a tmpfs of the 2 MB quota (the logs beside it keep their room for the reward)."""
    script = (
        "head -c 8000000 /dev/zero > big; [ $(du -sk . | cut -f1) -le 2048 ] "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    spec = rig.spec(FILES, {"test.sh": script})
    state = await rig.env.reset(spec, "s0")
    assert (await rig.env.verify(spec, state, LIMITS)).score == 1.0
    assert mounts_under(rig.host.directory) == [rig.host.sessions["s0"].workspace]


async def test_script_check_reads_the_reward_and_keeps_tests_read_only(rig: Rig) -> None:
    script = (
        "cd /app && touch /tests/planted 2>/dev/null && echo 0 > /logs/verifier/reward.txt && exit\n"
        "python3 -c 'import calc; print(calc.add(2, 3))' | grep -qx 5 "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0.25 > /logs/verifier/reward.txt\n"
    )
    spec = rig.spec(FILES, {"test.sh": script}, workdir="/srv/repo", env_vars={"MODE": "x"})
    state = await rig.env.reset(spec, "s0")
    assert (await rig.env.verify(spec, state, LIMITS)).score == 0.25
    fixed = "def add(a, b):\n    return a + b\n"
    state, _ = await rig.env.step(
        state, call("write_file", path="/srv/repo/calc.py", content=fixed), LIMITS
    )
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 1.0 and graded.result.status is ExecStatus.PASSED


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("exit 0\n", "wrote no reward"),
        ("echo lots > /logs/verifier/reward.txt\n", "not a number"),
        ("echo 3 > /logs/verifier/reward.txt\n", r"outside \[0, 1\]"),
        ("echo 1.01 > /logs/verifier/reward.txt\n", r"outside \[0, 1\]"),
        ("echo -0.5 > /logs/verifier/reward.txt\n", r"outside \[0, 1\]"),
        ("ln -s /etc/hostname /logs/verifier/reward.txt\n", "not a regular file"),
        ("mkdir /logs/verifier/reward.txt\n", "not a regular file"),  # was IsADirectoryError
    ],
)
async def test_a_broken_check_is_the_tasks_fault(rig: Rig, script: str, error: str) -> None:
    spec = rig.spec(FILES, {"test.sh": script})
    state = await rig.env.reset(spec, "s0")
    with pytest.raises(InvalidTask, match=error):
        await rig.env.verify(spec, state, LIMITS)


async def test_a_script_check_scores_zero_as_written_and_nothing_past_its_deadline(
    rig: Rig,
) -> None:
    spec = rig.spec(FILES, {"test.sh": "echo 0 > /logs/verifier/reward.txt\n"})
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 0.0 and graded.result.status is ExecStatus.FAILED
    late = "echo 1 > /logs/verifier/reward.txt\nsleep 30\n"  # the reward is written, then late
    spec = rig.spec(FILES, {"test.sh": late})
    state = await rig.env.reset(spec, "s1")
    graded = await rig.env.verify(spec, state, LIMITS.model_copy(update={"timeout_s": 1}))
    assert graded.score == 0.0 and graded.result.status is ExecStatus.TIMEOUT
    assert graded.result.tests_passed == 0


async def test_a_verifier_whose_scratch_fails_frees_its_slot(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch directory that cannot be made (its tmpfs: ENOMEM) once kept the slot taken
    for it, one of the worker's 512, for good."""
    spec = rig.spec(FILES)
    state = await rig.env.reset(spec, "s0")
    free = len(rig.host._free)

    def no_memory(*_: object) -> bool:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(rig.host, "quota", no_memory)
    with pytest.raises(OSError, match="Cannot allocate memory"):
        await rig.env.verify(spec, state, LIMITS)
    assert len(rig.host._free) == free and rig.host.leftovers == {}
    assert [p.name for p in rig.host.directory.iterdir()] == ["s0"]
