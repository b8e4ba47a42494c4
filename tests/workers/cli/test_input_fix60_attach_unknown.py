"""`tempered train --attach RUN` with a run no one started exits 2, and the module says exit 2
means nothing started: it brought the whole embedded stack up first (Temporal, to ask) and left
it running. Now what this call started is stopped again when the run is not found; what an
earlier `up` started stays. Real `tempered` processes on a private home and free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import stack
from tests.fixtures.stack import Stack


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[Stack]:
    """A stack's settings and environment, nothing started; whatever runs at the end is stopped."""
    home = tmp_path / "home"
    assert home.name == "home" and tmp_path in home.parents
    unstarted = Stack(home)
    yield unstarted
    unstarted.tempered("down", "--force")


def states(unstarted: Stack) -> dict[str, str]:
    """Service → its state's first word (`infra.stack.status`: running, stopped)."""
    return {name: line.split()[0] for name, line in stack.status(unstarted.settings).items()}


def test_attach_to_an_unknown_run_leaves_nothing_running(unstarted: Stack) -> None:
    attach = unstarted.tempered("train", "--attach", "no-such-run")
    assert attach.returncode == 2, attach.stdout + attach.stderr
    assert "no-such-run" in attach.stderr
    assert "Traceback" not in attach.stderr
    assert states(unstarted) == dict.fromkeys(("temporal", "s3", "codec"), "stopped")


def test_attach_to_an_unknown_run_keeps_what_an_earlier_up_started(unstarted: Stack) -> None:
    up = unstarted.tempered("up")
    assert up.returncode == 0, up.stdout + up.stderr
    attach = unstarted.tempered("train", "--attach", "no-such-run")
    assert attach.returncode == 2, attach.stdout + attach.stderr
    assert "stopped" not in attach.stderr
    assert set(states(unstarted).values()) == {"running"}
