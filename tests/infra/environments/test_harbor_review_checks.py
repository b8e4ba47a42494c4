"""A Harbor script check's reward counts only from a script that exits 0 (the review's forgeries).

The workspace's code runs inside the script, under its uid. A wrong greet.py scored 1.0 on
examples/harbor/fix-greeting by writing reward.txt=1 and chmodding /logs/verifier 0o500: the
scorer's unlink failed, the script exited 1, and the reward was read before the exit status.
Any non-zero exit (a signal too: 128+n) now scores an agent's tree 0, the reward it left
ignored; /logs/verifier is root's (mode 1777), so the code cannot chmod it. Code of the same uid
could also rewrite pid 1 (or the script's bash) through /proc/<pid>/mem to exit 0: both run
execute-only copies of the host's shells (`Mounts.sealed`), which no process may ptrace or read.
"""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import BadReward
from infra.environments.tree import pack_files
from infra.environments.workspace import WorkspaceState
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"
RULE = "a reward counts only from a script that exits 0"
REWRITE = """import ctypes, os, struct
# exit_group(0) on x86-64: mov edi, 0; mov eax, 231; syscall; in a loop
CODE = bytes.fromhex('31ff' 'b8e7000000' '0f05' 'ebf5')
def rewrite(pid):
    with open(f'/proc/{pid}/syscall') as f:
        fields = f.read().split()
    pc = int(fields[-1], 16)
    with open(f'/proc/{pid}/mem', 'r+b', buffering=0) as mem:
        mem.seek(pc)
        mem.write(CODE)
"""


def script(body: str) -> dict[str, str]:
    return {"test.sh": body}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (f"echo 1 > {REWARD}\nexit 143\n", 143),
        (f"echo 1 > {REWARD}\nexit 255\n", 255),
        (f"echo 1 > {REWARD}\nexit 1\n", 1),
        (f"echo 1 > {REWARD}\nkill -TERM $$\n", 143),
        (f"echo 1 > {REWARD}\nkill -KILL $$\n", 137),
        (f"echo 1 > {REWARD}\nkill -SEGV $$\n", 139),
    ],
    ids=["exit-143", "exit-255", "exit-1", "sigterm", "sigkill", "sigsegv"],
)
async def test_a_reward_from_a_script_that_did_not_exit_0_scores_zero(
    rig: Rig, body: str, code: int
) -> None:
    spec = rig.spec({"a.txt": "a\n"}, script(body))
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 0.0 and graded.result.status is ExecStatus.FAILED, graded.result
    assert graded.result.exit_code == code
    detail = graded.result.detail
    assert detail.startswith(f"scored 0: tests/test.sh exited {code}: {RULE}"), detail
    assert "(the reward it left, 1, is ignored)" in detail, detail


async def test_a_script_that_exits_nonzero_without_a_reward_is_a_bad_reward(rig: Rig) -> None:
    """`set -e; test …; echo 1 > reward.txt`: a failing test writes no reward, which Harbor's
    verifier fails on too. Its run scores 0 (an agent's tree), and the task is broken where
    its untouched tree does the same (tests/activities/test_harbor_verify_no_reward.py)."""
    body = f'set -e\ntest "$(cat /app/out.txt)" = ok\necho 1 > {REWARD}\n'
    spec = rig.spec({"out.txt": "nope\n"}, script(body))
    with pytest.raises(BadReward, match="tests/test.sh exited 1 and wrote no reward") as raised:
        await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
    assert raised.value.graded is not None and raised.value.graded.score == 0.0
    solved = rig.spec({"out.txt": "ok\n"}, script(body))
    assert (await rig.env.verify(solved, await rig.env.reset(solved, "s1"), LIMITS)).score == 1.0


async def test_a_script_that_exits_0_without_a_reward_is_still_the_tasks_fault(rig: Rig) -> None:
    spec = rig.spec({"a.txt": "a\n"}, script("true\n"))
    with pytest.raises(BadReward, match="wrote no reward"):
        await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)


WRITE = f"python3 /app/calc.py\necho 0 > {REWARD}\n"
REPLACE = f"python3 /app/calc.py\nrm -f {REWARD} && echo 0 > {REWARD}\n"  # fix-greeting's way


@pytest.mark.parametrize(
    ("scorer", "code"),
    [
        (WRITE, f"open('{REWARD}', 'w').write('1'); os.chmod('{REWARD}', 0o400)"),
        (REPLACE, f"open('{REWARD}', 'w').write('1'); os.chmod('/logs/verifier', 0o500)"),
    ],
    ids=["chmod-reward", "chmod-logs"],
)
async def test_code_that_guards_its_own_reward_scores_zero(
    rig: Rig, scorer: str, code: str
) -> None:
    """The scorer cannot write over (or replace) the reward the code left: it exits non-zero."""
    spec = rig.spec({"a.txt": "a\n"}, script(scorer))
    final = rig.add(pack_files({"calc.py": f"import os\ntry:\n    {code}\nexcept OSError: pass\n"}))
    graded = await rig.env.verify(spec, WorkspaceState("forged", final.ref), LIMITS)
    assert graded.score == 0.0, graded.result


@pytest.mark.parametrize(
    ("target", "then"),
    [("1", "os.kill(os.getppid(), 9)"), ("os.getppid()", "")],
    ids=["pid-1", "bash"],
)
async def test_code_that_rewrites_pid_1_or_the_scripts_bash_to_exit_0_scores_zero(
    rig: Rig, target: str, then: str
) -> None:
    """The code writes reward 1, then exit_group(0) into pid 1 (and kills the script: pid 1's
    wait returns into it) or into the script's bash (whose wait for the code returns into it):
    either way the script would have exited 0 before writing its own reward."""
    code = (
        f"{REWRITE}open('{REWARD}', 'w').write('1')\n"
        f"try:\n    rewrite({target})\nexcept OSError as exc:\n    print('refused', exc, flush=True)\n"
        f"{then}\n"
    )
    spec = rig.spec({"a.txt": "a\n"}, script(f"python3 /app/calc.py\necho 0 > {REWARD}\n"))
    final = rig.add(pack_files({"calc.py": code}))
    graded = await rig.env.verify(spec, WorkspaceState("forged", final.ref), LIMITS)
    assert graded.score == 0.0, graded.result
    assert "refused" in graded.result.stdout, graded.result
