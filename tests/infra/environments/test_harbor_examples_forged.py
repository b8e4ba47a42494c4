"""The shipped Harbor examples (examples/harbor) through the real reset/step/verify path: the
reference solution scores 1, the untouched workspace 0, and so do the forgeries a review found.

- Inputs rewritten: count-lines and sort-names once computed their expected answer from the
  workspace's own data, which the agent may rewrite (blank data files and `echo 0 > total.txt`
  scored 1 on a held-out task). They now compare with their own copies in tests/ (/tests is
  read-only).
- A module of the workspace shadowing the standard library's in the test's Python (sort-names
  ran `python3 -`, whose path starts with the working directory).
- fix-greeting's code claiming the reward itself: exiting 0 at import, leaving a process that
  writes the reward after the test did, writing it and killing the test, writing it and
  chmodding /logs/verifier (the test could not replace it and exited 1), writing it and
  rewriting pid 1 to exit 0 (/proc/1/mem: pid 1 is an execute-only shell, which none may write),
  writing a reward.json of its own (the test's reward.txt is read first, as in Harbor), a
  process whose main thread alone ended (SYS_exit, not exit_group) while a thread of it kept
  writing the reward: its /proc/<pid>/stat said Z, and the test's kill loop skipped it.

A verify that raises `BadReward` is scored as the verify activity scores an agent's tree: its
verdict, 0 (activities/environment.py).
"""

from __future__ import annotations

import pytest

from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import BadReward
from infra.tasks.harbor import load_harbor
from tests.infra.environments.conftest import Rig, needs_root
from tests.paths import REPO_ROOT

pytestmark = [needs_root, pytest.mark.asyncio]
EXAMPLES = REPO_ROOT / "examples" / "harbor"
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"
SOLUTION = "<the task's solution/solve.sh>"
GREET_EXIT = "printf 'import os\\nos._exit(0)\\n' > greet.py"
GREET_WRITER = (  # the review's: a child that keeps writing 1 after the test wrote 0
    "cat > greet.py <<'PY'\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n"
    "    while True:\n        try:\n            open('/logs/verifier/reward.txt', 'w').write('1')\n"
    "        except OSError: pass\n        time.sleep(0.0005)\n"
    "def greet(name):\n    return 'wrong'\nPY"
)
GREET_KILL = (  # write the reward, then kill the process that imported greet (the test)
    "cat > greet.py <<'PY'\nimport os, signal\nopen('/logs/verifier/reward.txt', 'w').write('1')\n"
    "os.kill(os.getppid(), signal.SIGKILL)\nPY"
)
GREET_CHMOD = (  # the review's: write 1, make /logs/verifier unwritable so the test cannot replace it
    "cat > greet.py <<'PY'\nimport os\nopen('/logs/verifier/reward.txt', 'w').write('1')\n"
    "try:\n    os.chmod('/logs/verifier', 0o500)\nexcept OSError: pass\n"
    "def greet(name):\n    return 'wrong'\nPY"
)
GREET_PID_1 = (  # write 1, then exit_group(0) into pid 1 through /proc/1/mem, and kill the test
    "cat > greet.py <<'PY'\nimport os\nopen('/logs/verifier/reward.txt', 'w').write('1')\n"
    "try:\n    pc = int(open('/proc/1/syscall').read().split()[-1], 16)\n"
    "    with open('/proc/1/mem', 'r+b', buffering=0) as mem:\n        mem.seek(pc)\n"
    "        mem.write(bytes.fromhex('31ffb8e70000000f05ebf5'))\nexcept OSError: pass\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if pid not in ('1', str(os.getpid())):\n        try: os.kill(int(pid), 9)\n"
    "        except OSError: pass\nPY"
)
GREET_JSON = (  # a reward.json of its own, and a child that keeps writing it after the test wrote 0
    "cat > greet.py <<'PY'\nimport os, time\nif os.fork() == 0:\n    os.setsid()\n"
    "    while True:\n        try:\n"
    "            open('/logs/verifier/reward.json', 'w').write('{\"reward\": 1}')\n"
    "        except OSError: pass\n        time.sleep(0.0005)\n"
    "def greet(name):\n    return 'wrong'\nPY"
)


def zombie_leader(reward: str, greeting: str) -> str:
    """The review's greet.py: returns `greeting`, and forks at import a process whose thread
    keeps writing `reward` while its main thread alone ends (SYS_exit, not exit_group): that
    process's /proc/<pid>/stat says Z while the thread runs on."""
    return (
        "cat > greet.py <<'PY'\nimport os, ctypes, threading\nif os.fork() == 0:\n"
        "    os.setsid()\n    def spin():\n        while True:\n            try:\n"
        "                with open('/logs/verifier/.mine', 'w') as f:\n"
        f"                    f.write('{reward}')\n"
        "                os.replace('/logs/verifier/.mine', '/logs/verifier/reward.txt')\n"
        "            except OSError: pass\n    threading.Thread(target=spin).start()\n"
        "    ctypes.CDLL(None).syscall(60, 0)\n"
        f"def greet(name):\n    return {greeting}\nPY"
    )


GREET_ZOMBIE = zombie_leader("1", "'wrong'")
# a right answer whose zombie-led thread writes 0: it scores 1 only if the test's SIGKILL ended
# that thread (else the test waits 5 s for it, and scores 0)
RIGHT_ZOMBIE = zombie_leader("0", "f'Hello, {name or \"world\"}!'")
BLANK_DATA = ": > data/a.txt; : > data/b.txt; : > data/c.txt; echo 0 > total.txt"
SHADOW = f'printf \'import os\\nopen("{REWARD}", "w").write("1")\\nos._exit(0)\\n\' > pathlib.py'
CASES = [
    ("count-lines", "solution", [SOLUTION], 1.0),
    ("count-lines", "untouched", [], 0.0),
    ("count-lines", "blank-data", [BLANK_DATA], 0.0),
    ("sort-names", "solution", [SOLUTION], 1.0),
    ("sort-names", "untouched", [], 0.0),
    ("sort-names", "blank-names", [": > names.txt; : > sorted.txt"], 0.0),
    ("sort-names", "one-name", ["echo 'Ada Lovelace' > names.txt; cp names.txt sorted.txt"], 0.0),
    ("sort-names", "shadow-pathlib", [SHADOW], 0.0),
    ("fix-greeting", "solution", [SOLUTION], 1.0),
    ("fix-greeting", "untouched", [], 0.0),
    ("fix-greeting", "exit-0-at-import", [GREET_EXIT], 0.0),
    ("fix-greeting", "writer-left-behind", [GREET_WRITER], 0.0),
    ("fix-greeting", "write-then-kill-the-test", [GREET_KILL], 0.0),
    ("fix-greeting", "chmod", [GREET_CHMOD], 0.0),
    ("fix-greeting", "rewrite-pid-1", [GREET_PID_1], 0.0),
    ("fix-greeting", "reward-json", [GREET_JSON], 0.0),  # reward.txt is read first
    ("fix-greeting", "zombie-leader", [GREET_ZOMBIE], 0.0),  # its thread runs on
    ("fix-greeting", "right-with-zombie-leader", [RIGHT_ZOMBIE], 1.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("task", "commands", "score"),
    [(task, commands, score) for task, _, commands, score in CASES],
    ids=[f"{task}-{name}" for task, name, _, _ in CASES],
)
async def test_an_example_scores_only_a_real_answer(
    rig: Rig, task: str, commands: list[str], score: float
) -> None:
    tasks, errors = load_harbor(EXAMPLES)
    assert not errors, errors
    (loaded,) = [t for t in tasks if t.spec.id == task]
    rig.objects.update(loaded.objects)
    spec = loaded.spec.workspace
    assert spec is not None
    solve = (EXAMPLES / task / "solution" / "solve.sh").read_text()
    state = await rig.env.reset(spec, "s0")
    for command in commands:
        call = ToolCall(
            name="bash", arguments={"command": solve if command == SOLUTION else command}
        )
        state, _ = await rig.env.step(state, call, LIMITS)
    try:
        graded = await rig.env.verify(spec, state, LIMITS)
    except BadReward as exc:  # the agent's code spoiled the reward: its verdict, scored 0
        assert exc.graded is not None, exc
        graded = exc.graded
    assert graded.score == score, graded.result


async def test_a_test_script_killed_by_a_signal_scores_zero_whatever_reward_it_left(
    rig: Rig,
) -> None:
    """The workspace's code runs inside a script check, under its uid: it could write a reward
    of 1 and then kill the script before the script writes its own. A reward counts only from a
    script that exits 0: one killed by SIGKILL (137) scores 0, the reward it left ignored."""
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": f"echo 1 > {REWARD}\nkill -KILL $$\n"})
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 0.0 and graded.result.status is ExecStatus.FAILED, graded.result
    assert graded.result.tests_passed == 0
    assert "tests/test.sh exited 137: a reward counts only from a script that exits 0" in (
        graded.result.detail
    )
