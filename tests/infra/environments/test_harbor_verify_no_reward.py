"""A Harbor script check that exits without leaving a reward is `BadReward`, whatever its exit.

A test script whose interpreter is missing (`#!/usr/bin/env python3.99`: exit 127) or whose
test runner is (`set -e; pytest …` without pytest) never writes a reward: it scored every tree
0, so training went on with groups of zeros and `tempered tasks validate` never said the task
was broken. Harbor takes a missing reward file as an error; here it is `BadReward` carrying the
run scored 0, like a script that exits 0 without one: the verify activity scores an agent's
tree 0 and fails the task only when its untouched tree does the same
(tests/activities/test_harbor_verify_no_reward.py). A reward left by a script that exits
non-zero still scores 0 (`EXIT_0_RULE`), never an error.
"""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import BadReward
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"


@pytest.mark.parametrize(
    ("script", "code", "says"),
    [
        (f"#!/usr/bin/env python3.99\nopen({REWARD!r}, 'w').write('1')\n", 127, "python3.99"),
        (f"#!/bin/bash\nset -e\nno-such-pytest /tests\necho 1 > {REWARD}\n", 127, "not found"),
        ("#!/bin/bash\nexit 3\n", 3, ""),
        (f"#!/bin/bash\necho lots > {REWARD}\nexit 1\n", 1, "not a number"),
    ],
    ids=["no-interpreter", "no-test-runner", "exit-3", "unreadable"],
)
async def test_a_script_that_leaves_no_reward_is_a_bad_reward(
    rig: Rig, script: str, code: int, says: str
) -> None:
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": script})
    with pytest.raises(BadReward) as raised:
        await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
    assert f"tests/test.sh exited {code}" in str(raised.value) and says in str(raised.value)
    graded = raised.value.graded
    assert graded is not None and graded.score == 0.0, raised.value
    assert graded.result.status is ExecStatus.FAILED and graded.result.exit_code == code
    assert graded.result.detail.startswith(f"scored 0: tests/test.sh exited {code}")


async def test_a_reward_left_by_a_script_that_exits_nonzero_still_scores_zero(rig: Rig) -> None:
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": f"echo 0 > {REWARD}\nexit 1\n"})
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
    assert graded.score == 0.0 and "exited 1" in graded.result.detail, graded.result
