"""A Harbor test script runs under its own `#!` line, as Harbor runs it.

Harbor's verifier makes tests/test.sh executable and runs it as a program (`chmod +x
/tests/test.sh`, then `/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1`), so the kernel
reads its `#!` line. Tempered ran every script under bash: a `#!/bin/sh` script got bash, a
`#!/usr/bin/env python3` one a bash syntax error, and `#!/bin/bash -e` lost its `-e`. A script
without a `#!` line is the shell's to run (bash), and one whose interpreter is sh or bash runs
that shell's execute-only copy (`sealed.py`), which the workspace's code cannot rewrite.
"""

from __future__ import annotations

import os

import pytest

from contracts.task import SandboxLimits
from infra.environments.checks import BadReward, InvalidTask
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"
SEALED = (  # 1 when this shell is execute-only: no process, its own uid's either, reads its environ
    f"if cat /proc/$$/environ > /dev/null 2>&1; then echo 0 > {REWARD}; "
    f"else echo 1 > {REWARD}; fi\n"
)
sh_is_not_bash = pytest.mark.skipif(
    os.path.realpath("/bin/sh") == os.path.realpath("/bin/bash"), reason="/bin/sh is bash here"
)


async def score(rig: Rig, test_sh: str) -> tuple[float, str, int | None]:
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": test_sh})
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
    return graded.score, graded.result.detail, graded.result.exit_code


@sh_is_not_bash
async def test_a_sh_script_runs_under_sh(rig: Rig) -> None:
    body = f'if [ -z "${{BASH_VERSION-}}" ]; then echo 1; else echo 0; fi > {REWARD}\n'
    assert (await score(rig, f"#!/bin/sh\n{body}"))[0] == 1.0
    assert (await score(rig, f"#! /usr/bin/env sh\n{body}"))[0] == 1.0
    assert (await score(rig, f"#!/bin/bash\n{body}"))[0] == 0.0


async def test_a_python_script_runs_under_python(rig: Rig) -> None:
    body = f"import sys\nopen({REWARD!r}, 'w').write('1' if sys.version_info >= (3,) else '0')\n"
    for shebang in ("#!/usr/bin/env python3", "#!/usr/bin/python3 -I"):
        graded, detail, _ = await score(rig, f"{shebang}\n{body}")
        assert graded == 1.0, (shebang, detail)


async def test_the_shebang_argument_is_passed(rig: Rig) -> None:
    """`#!/bin/bash -e`: the failing `false` ends the script (exit 1) before it writes 1."""
    test = f"#!/bin/bash -e\necho 0 > {REWARD}\nfalse\necho 1 > {REWARD}\n"
    graded, detail, code = await score(rig, test)
    assert graded == 0.0 and code == 1, detail
    assert "exited 1" in detail


@pytest.mark.parametrize(
    "shebang",
    ["", "#!/bin/bash\n", "#!/usr/bin/env bash\n", "#!/bin/sh\n", "#!/usr/bin/bash -u\n"],
    ids=["none", "bash", "env-bash", "sh", "bash-arg"],
)
async def test_a_sh_or_bash_script_runs_sealed(rig: Rig, shebang: str) -> None:
    """The script's shell is an execute-only copy (`sealed.py`): its memory is out of reach."""
    graded, detail, _ = await score(rig, shebang + SEALED)
    assert graded == 1.0, detail


async def never_rewards(rig: Rig, test_sh: str) -> BadReward:
    """The `BadReward` of a script that exits without a reward (its run scored 0): the task's
    fault where its untouched tree does the same (tests/test_harbor_verify_no_reward.py)."""
    with pytest.raises(BadReward) as raised:
        await score(rig, test_sh)
    graded = raised.value.graded
    assert graded is not None and graded.score == 0.0, raised.value
    assert graded.result.exit_code not in (0, None), graded.result
    return raised.value


async def test_a_script_whose_interpreter_is_missing_is_a_bad_reward(rig: Rig) -> None:
    bad = await never_rewards(rig, f"#!/no/such/interpreter\necho 1 > {REWARD}\n")
    assert "/no/such/interpreter" in str(bad) and "wrote no reward" in str(bad), bad


async def test_a_crlf_shebang_fails_as_the_kernel_fails_it(rig: Rig) -> None:
    """`#!/bin/bash\\r`: the kernel looks for a program named "bash\\r" (no such file)."""
    await never_rewards(rig, f"#!/bin/bash\r\necho 1 > {REWARD}\r\n")


async def test_another_interpreter_runs_the_hosts_readable_program(rig: Rig) -> None:
    """Not covered (checks.py): `env -S bash` is no sealed shell; the probe above tells them apart."""
    graded, detail, _ = await score(rig, "#!/usr/bin/env -S bash\n" + SEALED)
    assert graded == 0.0, detail


async def test_a_script_the_hidden_tests_do_not_hold_is_the_tasks_fault(rig: Rig) -> None:
    spec = rig.spec({"a.txt": "a\n"}, {"other.sh": "echo 1\n"})
    with pytest.raises(InvalidTask, match=r"the hidden tests hold no tests/test.sh"):
        await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)


async def test_a_shebang_line_the_kernel_would_cut_is_the_tasks_fault(rig: Rig) -> None:
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": "#!/bin/sh " + "x" * 300 + "\necho 1\n"})
    with pytest.raises(InvalidTask, match="its #! line is longer than 255 bytes"):
        await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
