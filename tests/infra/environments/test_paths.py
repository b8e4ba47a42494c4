"""`infra.environments.paths.resolve` on a real directory: what the agent's own links may do.
Links out and `..` past the top through the tools are tests/infra/environments/test_workspace.py's;
here the edges no tool call reaches on its way: empty and NUL paths, link loops, the limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.environments.paths import MAX_LINKS, PathError, resolve

WORKDIR = "/app"


@pytest.mark.parametrize("path", ["", "a\0b", "/app/a\0"])
def test_an_empty_path_or_one_with_a_nul_byte_is_refused_with_a_message(
    tmp_path: Path, path: str
) -> None:
    """Not the workspace's root for "", not os.lstat's bare ValueError for a NUL."""
    with pytest.raises(PathError, match="empty or holds a NUL byte"):
        resolve(tmp_path, WORKDIR, path)


def test_a_link_loop_is_refused_not_followed_forever(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    os.symlink("self", tmp_path / "self")
    for path in ("a", "b/x", "/app/self"):
        with pytest.raises(PathError, match="too many levels of links"):
            resolve(tmp_path, WORKDIR, path)


def test_a_chain_of_links_resolves_up_to_the_kernels_limit(tmp_path: Path) -> None:
    """As ELOOP: 40 links on one path are followed, the 41st is refused."""
    (tmp_path / "file.py").write_text("x = 1\n")
    os.symlink("file.py", tmp_path / "link0")
    for n in range(1, MAX_LINKS + 1):
        os.symlink(f"link{n - 1}", tmp_path / f"link{n}")
    assert MAX_LINKS == 40
    assert resolve(tmp_path, WORKDIR, f"link{MAX_LINKS - 1}") == "file.py"  # 40 links
    with pytest.raises(PathError, match="too many levels"):
        resolve(tmp_path, WORKDIR, f"link{MAX_LINKS}")  # 41


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """`x`, `sub/x`, `sub/deep/`, and the agent's link `d -> sub/deep`."""
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "x").write_text("at root\n")
    (tmp_path / "sub" / "x").write_text("in sub\n")
    os.symlink("sub/deep", tmp_path / "d")
    return tmp_path


@pytest.mark.parametrize(
    ("path", "resolved"),
    [
        ("d/../x", "sub/x"),  # `..` of the link's target, as `cat d/../x` reads
        ("/app/d/../x", "sub/x"),
        ("./d/./../x", "sub/x"),
        ("sub/deep/../../x", "x"),
        ("up", "sub/x"),  # up -> /app/d/../x: an absolute target's `..` alike
    ],
)
def test_dot_dot_is_taken_after_the_link_before_it_as_the_kernel_does(
    linked: Path, path: str, resolved: str
) -> None:
    """Before, `..` was removed as text first: `d/../x` read the workspace's own `x`."""
    os.symlink("/app/d/../x", linked / "up")
    assert resolve(linked, WORKDIR, path) == resolved


@pytest.mark.parametrize(
    "path",
    ["../x", "d/../../../x", "/app/d/../../../etc/passwd", "/app/../etc/passwd", "/apps/x",
     "/etc/passwd", "far/x"],
)  # fmt: skip
def test_every_way_out_of_the_workspace_is_still_refused(linked: Path, path: str) -> None:
    """Out past the top: `d/../../..` is `sub/deep/../../..`; far -> /app/d/../../.."""
    os.symlink("/app/d/../../..", linked / "far")
    with pytest.raises(PathError, match="outside the workspace"):
        resolve(linked, WORKDIR, path)
