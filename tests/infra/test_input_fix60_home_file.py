"""A home that is a file: `tempered up` and `train` named it ("home … is not a writable
directory: it is not a directory"), `status` and `down` (`infra.stack`'s) printed a raw "[Errno 20] Not a
directory: …/run/temporal.pid". Now all say the same line (`infra.stack.check_home`); `status`
and `down` only read and stop, so a read-only home is no refusal of theirs. Real `tempered`
processes, the home under tmp_path."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import stack
from infra.settings import Settings

BIN = Path(sys.executable).parent
CLEAR = "(TEMPERED_HOME or the `home` setting) is not a writable directory: it is not a directory"


def tempered(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TEMPERED_")}
    env["TEMPERED_HOME"] = str(home)
    return subprocess.run(
        [str(BIN / "tempered"), *args],
        env=env,
        cwd=home.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", [["status"], ["train", "--attach", "some-run"]])
def test_a_home_that_is_a_file_is_named_clearly(tmp_path: Path, command: list[str]) -> None:
    home = tmp_path / "afile"
    home.write_text("not a home")
    done = tempered(home, *command)
    assert done.returncode != 0
    assert f"home {home} {CLEAR}" in done.stderr, done.stderr
    assert "Errno" not in done.stderr, done.stderr
    assert home.read_text() == "not a home"


def test_stack_down_and_status_name_a_home_that_is_a_file(tmp_path: Path) -> None:
    """`tempered down` stops the workers first (workers/cli/stack.py), which still fail raw."""
    home = tmp_path / "afile"
    home.write_text("not a home")
    for call in (stack.down, stack.status, stack.running):
        with pytest.raises(ValueError, match="is not a writable directory: it is not a directory"):
            call(Settings(home=home))


@contextlib.contextmanager
def read_only(home: Path) -> Iterator[None]:
    """`home` unwritable, to root too (which mode 0555 does not stop): a read-only bind mount."""
    if os.geteuid() != 0:
        home.chmod(0o555)
        try:
            yield
        finally:
            home.chmod(0o755)
        return
    subprocess.run(["mount", "--bind", str(home), str(home)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(home)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(home)], check=True)


def test_status_and_down_of_a_read_only_home_are_no_refusal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with read_only(home):
        assert not os.access(home, os.W_OK)  # as the refusal would judge it
        settings = Settings(home=home)
        assert set(stack.status(settings).values()) == {"stopped"}
        assert all(line.endswith("was not running") for line in stack.down(settings))
