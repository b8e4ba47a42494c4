"""Harbor verdicts a wrong solution forged (review 62), through the real reset -> step -> verify
path over bwrap.

- reward.json's entries that were no numbers were dropped before its `reward` was looked up:
  `{"reward": false, "failed": 1}` scored 1.0 (its only number, `failed`). Where `reward` is
  there its value is the score (a boolean as 0 or 1, as Harbor's pydantic `float | int` takes
  it), or the reward is refused naming it; only without it, the only number.
- A final workspace's link into the verifier's own files (`ln -s /tests/expected.txt
  primes.txt`) made test.sh's `cmp /app/primes.txt /tests/expected.txt` pass, no agent code
  running at verify: such a workspace scores 0, the link named, whichever way it gets there
  (relative, through other links, /proc, /dev/fd); links within the workspace still work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from infra.environments.checks import BadReward
from tests.infra.environments.conftest import Rig, needs_root
from tests.infra.environments.test_harbor_reward_json import logs, reward

LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"
EXPECTED = "2\n3\n5\n"
CMP_TEST = (  # the review's cmp-task: the answer compared with the task's own copy
    "#!/bin/bash\n"
    "if [ -f /app/primes.txt ] && cmp -s /app/primes.txt /tests/expected.txt; then\n"
    f"    echo 1 > {REWARD}\nelse\n    echo 0 > {REWARD}\nfi\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"reward": false, "failed": 1}', 0.0),
        ('{"reward": true, "failed": 0}', 1.0),
        ('{"reward": false}', 0.0),
        ('{"reward": 0, "failed": 1}', 0.0),
        ('{"reward": 0.5, "report": "x", "ok": true}', 0.5),
        ('{"accuracy": 0.25, "ok": false}', 0.25),  # no `reward`: its only number
    ],
)
def test_the_reward_key_is_the_score_whatever_else_the_file_holds(
    tmp_path: Path, text: str, expected: float
) -> None:
    assert reward(logs(tmp_path, reward_json=text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"reward": null, "failed": 1}',
        '{"reward": "1", "failed": 1}',
        '{"reward": [1], "failed": 1}',
        '{"reward": {"a": 1}, "failed": 1}',
    ],
    ids=["null", "string", "list", "object"],
)
def test_a_reward_key_that_is_no_number_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    with pytest.raises(BadReward, match=r"'reward' is .*not a number"):
        reward(logs(tmp_path, reward_json=text))


async def verify(rig: Rig, tests: dict[str, str], commands: list[str]) -> tuple[float, str]:
    spec = rig.spec({"README": "find the primes below 6\n"}, tests)
    state = await rig.env.reset(spec, "s0")
    for command in commands:
        state, _ = await rig.env.step(
            state, ToolCall(name="bash", arguments={"command": command}), LIMITS
        )
    try:
        graded = await rig.env.verify(spec, state, LIMITS)
    except BadReward as exc:
        assert exc.graded is not None, exc
        graded = exc.graded
    return graded.score, graded.result.detail


@needs_root
@pytest.mark.asyncio
async def test_a_json_reward_false_scores_zero_end_to_end(rig: Rig) -> None:
    """The review's json-bool task: a wrong greet.py left `{"reward": false, "failed": 1}`."""
    test = '#!/bin/bash\necho \'{"reward": false, "failed": 1}\' > /logs/verifier/reward.json\n'
    score, detail = await verify(rig, {"test.sh": test}, [])
    assert score == 0.0, detail


FORGED = [
    ("absolute", "ln -s /tests/expected.txt primes.txt"),
    ("relative", "ln -s ../tests/expected.txt primes.txt"),
    ("dotdot-deep", "mkdir -p a/b && ln -s ../../../tests/expected.txt primes.txt"),
    ("through-root", "ln -s / root && ln -s root/tests/expected.txt primes.txt"),
    ("chain", "ln -s /tests t && ln -s t/expected.txt p2 && ln -s p2 primes.txt"),
    ("dir-link", "ln -s /tests t && ln -s t/expected.txt primes.txt"),
    ("proc", "ln -s /proc/self/root/tests/expected.txt primes.txt"),
    ("dev-fd", "ln -s /dev/fd/../root/tests/expected.txt primes.txt"),
    ("via-app", "ln -s /app/../tests/expected.txt primes.txt"),
    ("nested-dir", "mkdir d && ln -s /tests d/t && ln -s d/t/expected.txt primes.txt"),
]


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize("command", [c for _, c in FORGED], ids=[n for n, _ in FORGED])
async def test_a_link_into_the_tests_scores_zero_naming_it(rig: Rig, command: str) -> None:
    score, detail = await verify(rig, {"test.sh": CMP_TEST, "expected.txt": EXPECTED}, [command])
    assert score == 0.0, detail
    assert "primes.txt ->" in detail and "link" in detail, detail


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "target", ["/logs/verifier/reward.txt", "/logs", "/solution/solve.sh", "/tmp/x", "/"]
)
async def test_a_link_into_the_verifiers_places_scores_zero(rig: Rig, target: str) -> None:
    """A script that writes /app/out.txt, linked to the reward, would write the reward."""
    make = f"printf '{EXPECTED}' > primes.txt && ln -s {target} out"
    score, detail = await verify(rig, {"test.sh": CMP_TEST, "expected.txt": EXPECTED}, [make])
    assert score == 0.0 and "out ->" in detail, detail


HONEST = [
    ("no-link", f"printf '{EXPECTED}' > primes.txt"),
    ("relative", f"printf '{EXPECTED}' > real.txt && ln -s real.txt primes.txt"),
    ("absolute-in-app", f"mkdir d && printf '{EXPECTED}' > d/r && ln -s /app/d/r primes.txt"),
    ("system", f"printf '{EXPECTED}' > primes.txt && ln -s /usr/bin/python3 py && ln -s /bin b"),
    ("dangling", f"printf '{EXPECTED}' > primes.txt && ln -s nowhere x && ln -s /nowhere y"),
    ("loop", f"printf '{EXPECTED}' > primes.txt && ln -s l1 l2 && ln -s l2 l1"),
    ("dev-null", f"printf '{EXPECTED}' > primes.txt && ln -s /dev/null log"),
]


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize("command", [c for _, c in HONEST], ids=[n for n, _ in HONEST])
async def test_links_within_the_workspace_still_score(rig: Rig, command: str) -> None:
    score, detail = await verify(rig, {"test.sh": CMP_TEST, "expected.txt": EXPECTED}, [command])
    assert score == 1.0, detail


@needs_root
@pytest.mark.asyncio
async def test_a_wrong_answer_without_links_still_scores_zero(rig: Rig) -> None:
    score, detail = await verify(
        rig, {"test.sh": CMP_TEST, "expected.txt": EXPECTED}, ["echo 7 > primes.txt"]
    )
    assert score == 0.0 and "link" not in detail, detail
