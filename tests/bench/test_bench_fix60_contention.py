"""bench/contention.py's worker processes never outlive the measurement: when one side dies
before the start, `measure` stops the other (it used to poll for a start file in a deleted
directory for ever, ~1.5 GB resident, its parent gone), and a side waiting for the start gives
up when the start file's directory is gone or its parent has changed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest


def test_a_side_that_dies_before_the_start_takes_the_other_down_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real processes: `generate` exits at once (as one that failed to load would), `train`
    would wait for ten minutes; `measure` must return with neither left running."""
    import contention

    started: list[subprocess.Popen[Any]] = []
    popen = subprocess.Popen

    def spawn(command: list[str], **options: Any) -> subprocess.Popen[Any]:
        assert "--role" in command  # only measure's own sides are replaced
        code = "raise SystemExit(3)" if "generate" in command else "import time; time.sleep(600)"
        process = popen([sys.executable, "-c", code], **options)
        started.append(process)
        return process

    monkeypatch.setattr(contention.subprocess, "Popen", spawn)
    try:
        with pytest.raises(SystemExit, match="died before it started"):
            contention.measure(("generate", "train"), "default", 1.0)
        monkeypatch.undo()
        assert len(started) == 2
        assert all(p.poll() is not None for p in started), [p.poll() for p in started]
    finally:
        for process in started:  # this test's own processes only, by their handle
            if process.poll() is None:
                process.kill()
                process.wait()


def _waiting(start: Path, **options: Any) -> tuple[threading.Thread, list[object]]:
    import contention

    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(contention.wait_for_start(start, "train", **options))
        except SystemExit as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, outcome


def test_a_waiting_side_gives_up_when_the_start_files_directory_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "contention-run"
    folder.mkdir()
    start = folder / "start"
    thread, outcome = _waiting(start)
    for _ in range(200):  # it says it is ready first
        if start.with_suffix(".train").exists():
            break
        time.sleep(0.01)
    assert start.with_suffix(".train").exists()
    assert folder.name == "contention-run" and folder.parent == tmp_path
    (start.with_suffix(".train")).unlink()
    folder.rmdir()  # what measure's TemporaryDirectory does when it ends
    thread.join(timeout=5)
    assert not thread.is_alive(), "still waiting for a start file that can never appear"
    assert len(outcome) == 1 and isinstance(outcome[0], SystemExit), outcome


def test_a_waiting_side_gives_up_when_its_parent_is_not_the_one_that_started_it(
    tmp_path: Path,
) -> None:
    start = tmp_path / "start"
    thread, outcome = _waiting(start, parent=os.getppid() + 1_000_000)  # no such parent
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], SystemExit), outcome


def test_a_waiting_side_gives_up_after_its_timeout(tmp_path: Path) -> None:
    thread, outcome = _waiting(tmp_path / "start", timeout=0.2)
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], SystemExit), outcome


def test_the_start_signal_gives_the_deadline(tmp_path: Path) -> None:
    start = tmp_path / "start"
    thread, outcome = _waiting(start)
    for _ in range(200):
        if start.with_suffix(".train").exists():
            break
        time.sleep(0.01)
    assert start.with_suffix(".train").exists(), "the side never said it was ready"
    ready = start.with_suffix(".deadline")
    ready.write_text(repr(123.5))
    ready.replace(start)
    thread.join(timeout=5)
    assert outcome == [123.5]


def test_sides_that_start_give_their_rates_and_are_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ordinary path through the same `finally`: each side (a real process running the
    bench's own `wait_for_start`) reports a rate; none is left running."""
    import contention

    started: list[subprocess.Popen[Any]] = []
    popen = subprocess.Popen
    bench = str(Path(contention.__file__).resolve().parent)

    def spawn(command: list[str], **options: Any) -> subprocess.Popen[Any]:
        role, start = command[command.index("--role") + 1], command[-1]
        code = (
            f"import sys; sys.path.insert(0, {bench!r}); from pathlib import Path; "
            f"import contention; contention.wait_for_start(Path({start!r}), {role!r}); "
            f"print({'2.50' if role == 'generate' else '7.00'!r})"
        )
        process = popen([sys.executable, "-c", code], **options)
        started.append(process)
        return process

    monkeypatch.setattr(contention.subprocess, "Popen", spawn)
    try:
        rates = contention.measure(("generate", "train"), "default", 0.5)
        monkeypatch.undo()
        assert rates == {"generate": 2.5, "train": 7.0}
        assert [p.returncode for p in started] == [0, 0]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
