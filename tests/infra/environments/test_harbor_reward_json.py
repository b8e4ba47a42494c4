"""A Harbor test script's reward in /logs/verifier/reward.json, as Harbor's verifier reads it.

Harbor reads reward.txt (one number) when the script wrote it, else reward.json: an object of
named numbers (Harbor's rewardkit writes `{"reward": 0.75}`). Tempered read reward.txt only, so
a script that wrote reward.json alone was refused as one that wrote no reward. The score is
the entry named `reward`, or the object's only number; it is read as reward.txt is (no link
followed, no FIFO waited on, a size bound, a finite number in [0, 1], only from a script that
exits 0).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import BadReward, read_reward
from infra.environments.tree import Check
from infra.sandbox.workspace import CommandResult
from tests.infra.environments.conftest import Rig, needs_root

LIMITS = SandboxLimits(timeout_s=20)
LOGS = "/logs/verifier"
RAN = CommandResult(ExecStatus.PASSED, 0, "", "", False, 1)


def logs(tmp_path: Path, name: str = "logs", **files: bytes | str) -> Path:
    """A directory `name` of `tmp_path` holding `files` (reward_txt: reward.txt)."""
    directory = tmp_path / name
    directory.mkdir()
    for name, data in files.items():
        (directory / name.replace("_", ".")).write_bytes(
            data.encode() if isinstance(data, str) else data
        )
    return directory


def reward(directory: Path) -> float:
    return read_reward(directory, Check(kind="script"), RAN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"reward": 0.75}', 0.75),
        ('{"reward": 1}', 1.0),
        ('{"reward": 0, "quality": 0.8}', 0.0),
        ('{"accuracy": 0.25}', 0.25),  # its only number
        ('{"accuracy": 0.5, "report": "3 of 6", "ok": true, "cases": [1, 2]}', 0.5),
        ('{"reward": -0.0}', 0.0),
        ('  {"reward": 0.5}\n', 0.5),
        ('{"reward": true}', 1.0),  # as Harbor's pydantic takes it (test_harbor62_verify.py)
        ('{"reward": false, "failed": 1}', 0.0),
    ],
)
def test_a_reward_json_is_read(tmp_path: Path, text: str, expected: float) -> None:
    assert reward(logs(tmp_path, reward_json=text)) == expected


def test_reward_txt_comes_first(tmp_path: Path) -> None:
    """Harbor's verifier reads reward.txt when it exists: reward.json is then not read."""
    assert reward(logs(tmp_path, reward_txt="0\n", reward_json='{"reward": 1}')) == 0.0
    assert reward(logs(tmp_path, "b", reward_txt="1", reward_json="not json")) == 1.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not a JSON object"),
        ("[0.5]", "not a JSON object"),
        ("0.5", "not a JSON object"),
        ('{"reward": 0.5', "not a JSON object"),
        ('{"reward": NaN}', "not a finite number"),
        ('{"reward": Infinity}', "not a finite number"),
        ('{"reward": -Infinity}', "not a finite number"),
        ('{"reward": 1e999}', "not a finite number"),
        ('{"reward": 1.5}', r"outside \[0, 1\]"),
        ('{"reward": -1}', r"outside \[0, 1\]"),
        ('{"reward": ' + "9" * 400 + "}", r"outside \[0, 1\]"),
        ('{"reward": "1"}', "names no number"),
        ('{"a": 1, "b": 0}', "names no number"),
        ("{}", "names no number"),
        ("[" * 100_000, "not a JSON object"),
        ('{"reward": 1}\x00', "not a JSON object"),
        (b'{"reward": 1, "r\xe9": 0}', "not a JSON object"),
    ],
    ids=[
        "empty", "list", "number", "truncated", "nan", "inf", "-inf", "overflow", "above",
        "below", "huge-int", "string", "two-names", "no-names", "deep", "nul", "latin-1",
    ],
)  # fmt: skip
def test_a_bad_reward_json_is_refused_saying_why(
    tmp_path: Path, text: str | bytes, why: str
) -> None:
    with pytest.raises(BadReward, match=why):
        reward(logs(tmp_path, reward_json=text))


def test_a_nan_reward_txt_is_refused_as_not_finite(tmp_path: Path) -> None:
    for text in ("nan", "inf", "-Infinity"):
        with pytest.raises(BadReward, match="not a finite number"):
            reward(logs(tmp_path, text, reward_txt=text))


def test_a_reward_json_past_its_size_is_refused_unread(tmp_path: Path) -> None:
    directory = logs(tmp_path)
    with open(directory / "reward.json", "wb") as sparse:
        sparse.truncate(1 << 40)  # a terabyte that is never read
    with pytest.raises(BadReward, match="reward.json holds more than"):
        reward(directory)


def test_a_reward_json_that_is_a_link_or_fifo_or_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"reward": 1}')
    linked = logs(tmp_path)
    (linked / "reward.json").symlink_to(target)
    with pytest.raises(BadReward, match="reward.json is not a regular file"):
        reward(linked)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "reward.json")  # never waited on
    with pytest.raises(BadReward, match="reward.json is not a regular file"):
        reward(fifo)
    directory = tmp_path / "directory"
    (directory / "reward.json").mkdir(parents=True)
    with pytest.raises(BadReward, match="reward.json is not a regular file"):
        reward(directory)


def test_no_reward_file_names_both(tmp_path: Path) -> None:
    with pytest.raises(BadReward, match=r"wrote no reward to .*reward.txt or .*reward.json"):
        reward(logs(tmp_path))


@needs_root
@pytest.mark.asyncio
async def test_a_script_that_writes_reward_json_is_scored(rig: Rig) -> None:
    for value, status in (("1", ExecStatus.PASSED), ("0.5", ExecStatus.FAILED)):
        body = f'echo \'{{"reward": {value}, "detail": "x"}}\' > {LOGS}/reward.json\n'
        spec = rig.spec({"a.txt": "a\n"}, {"test.sh": body})
        graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
        assert graded.score == float(value) and graded.result.status is status, graded.result


@needs_root
@pytest.mark.asyncio
async def test_a_reward_json_from_a_script_that_did_not_exit_0_is_ignored(rig: Rig) -> None:
    body = f"echo '{{\"reward\": 1}}' > {LOGS}/reward.json\nexit 3\n"
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": body})
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), LIMITS)
    assert graded.score == 0.0 and graded.result.exit_code == 3, graded.result
    assert "(the reward it left, 1, is ignored)" in graded.result.detail
