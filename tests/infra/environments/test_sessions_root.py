"""The sessions root (`sandbox.workspaces.root`) is Tempered's alone: a worker makes it 0711 and
removes what dead workers left in it only where Tempered made it (its marker file) or every
entry is a worker's directory (a root of the build before the marker, or an empty one: it is
adopted and marked); a directory of the user's is refused at the worker's start, untouched.
The sweep removes only names a worker gives its directory (`<pid>-<start ticks>`).
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.environments.dead_workers import MARKER, _adoptable, sweep_dead, worker_dir_name
from infra.environments.mounts import remove_tree
from infra.environments.sessions import SessionHost
from infra.sandbox.base import SandboxInfraError
from infra.settings import WorkspaceSettings


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh directory whose parents sandbox uids can pass (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="tempered-test-roots-"))
    path.chmod(0o755)
    yield path
    remove_tree(path)


def _host(root: Path) -> SessionHost:
    return SessionHost(WorkspaceSettings(root=root, disk="directory"))


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_users_directory_is_refused_and_left_as_it_was(base: Path) -> None:
    """It was chmodded 0711 and lost `2023/` (pid 2023, no start: "dead") and `2024-photos/`."""
    root = base / "userdata"
    for name in ("2023", "2024-photos", "notes"):
        (root / name).mkdir(parents=True)
    (root / "2023" / "report.txt").write_text("mine")
    root.chmod(0o1777)
    with pytest.raises(SandboxInfraError) as caught:
        _host(root)
    message = str(caught.value)
    assert message.startswith(f"sandbox.workspaces.root {root} holds what Tempered did not make")
    assert "'2023'" in message and "set sandbox.workspaces.root to a new or empty" in message
    assert _entries(root) == ["2023", "2024-photos", "notes"]
    assert (root / "2023" / "report.txt").read_text() == "mine"
    assert _mode(root) == 0o1777


def test_a_shared_directory_like_tmp_is_refused_even_empty(base: Path) -> None:
    """`root = "/tmp"` dropped /tmp's sticky bit (made it 0711)."""
    root = base / "shared"
    root.mkdir()
    root.chmod(0o1777)
    with pytest.raises(SandboxInfraError, match=r"is shared \(its sticky bit is set"):
        _host(root)
    assert _mode(root) == 0o1777 and _entries(root) == []


def test_a_root_tempered_made_is_marked_and_its_dead_workers_swept(base: Path) -> None:
    root = base / "made" / "here"
    remove_tree(_host(root).directory)  # as its worker's shutdown does
    assert _entries(root) == [MARKER] and _mode(root) == 0o711
    dead = root / f"{_dead_pid()}-12345"
    dead.mkdir()
    (root / "notes").mkdir()  # not a worker's name: never swept, nor refused once marked
    host = _host(root)
    assert host.swept.directories == 1 and not dead.exists()
    assert _entries(root) == sorted([MARKER, "notes", worker_dir_name()])


@pytest.mark.parametrize("mode", [0o711, 0o700, 0o777])
def test_a_root_of_worker_directories_alone_is_adopted(base: Path, mode: int) -> None:
    """A root of the previous build (0711, worker directories, no marker), an empty one (a
    mkdtemp, a pod's emptyDir: 0777) keep working, and are marked from then on."""
    root = base / "old"
    dead = root / f"{_dead_pid()}-12345"
    dead.mkdir(parents=True)
    root.chmod(mode)
    host = _host(root)
    assert host.swept.directories == 1
    assert _entries(root) == sorted([MARKER, worker_dir_name()]) and _mode(root) == 0o711


def test_only_names_a_worker_gives_its_directory_are_swept(base: Path) -> None:
    root = base / "names"
    root.mkdir()
    dead = f"{_dead_pid()}-12345"
    keep = ["2023", "2024-photos", "12-ab", "12-34-56", "-12", "12-", "notes", "٣-٣"]
    for name in [dead, *keep]:
        (root / name).mkdir()
    assert sweep_dead(root).directories == 1
    assert _entries(root) == sorted(keep)


def test_a_live_workers_directory_is_kept(base: Path) -> None:
    root = base / "live"
    live = root / worker_dir_name(os.getppid())
    live.mkdir(parents=True)
    assert sweep_dead(root).directories == 0 and live.exists()


def test_a_worker_that_finds_the_marker_a_sibling_just_wrote_adopts_the_root(base: Path) -> None:
    """Two workers starting on one fresh root: B found no marker, then A wrote it; B took A's
    marker for something Tempered did not make and refused the root."""
    root = base / "raced"
    root.mkdir()
    (root / MARKER).write_text("written by the sibling between the check and the listing\n")
    _adoptable(root)
