"""A Harbor script check's environment: the base one plus `[verifier] env`, never the Dockerfile's.

The Dockerfile's ENV (`WorkspaceSpec.env_vars`) reached the verifier, so a final workspace
could forge the reward without the test running its code: `ENV PATH=/app/.venv/bin:$PATH` ran
the agent's planted `python3`, `ENV HOME=/app` (or `WORKDIR /tmp`, where the base HOME is the
workspace) loaded a `.pth` the agent put in its user site-packages before the scorer's first
line. Each of those trees scored 1.0 against a check that fails every tree. The agent's steps
keep the Dockerfile's ENV; the verifier's HOME is a fresh directory outside the workspace and
Python's user site is off in it, even where the task's own `[verifier] env` names HOME.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from infra.environments.tree import Check, File, pack_files
from infra.environments.workspace import WorkspaceState
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"
TESTS = {  # a check no tree passes: its scorer always fails
    "test.sh": f"if python3 /tests/check.py; then echo 1 > {REWARD}; else echo 0 > {REWARD}; fi\n",
    "check.py": "raise SystemExit(1)\n",
}
PASSES = "#!/bin/sh\nexit 0\n"
"""The agent's `python3`: the check passes."""
PTH = "import os; os._exit(0)\n"
"""The agent's `.pth`: every python3 that reads its user site exits 0 at start."""


def user_site(home: str) -> str:
    """The user site-packages (below `home`) of the host's python3, which the sandbox runs."""
    version = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return f"{home}/.local/lib/python{version}/site-packages"


async def score(
    rig: Rig, final: Mapping[str, File | str], check: Check | None = None,
    workdir: str = "/app", env_vars: dict[str, str] | None = None,
) -> float:  # fmt: skip
    """The score of the tree `final` against `TESTS`, in a task of that workdir and ENV."""
    tests = rig.add(pack_files(TESTS, check or Check(kind="script")))
    workspace = rig.spec({"a.txt": "a\n"}, workdir=workdir, env_vars=env_vars or {})
    workspace = workspace.model_copy(update={"verifier": tests.ref})
    tree = rig.add(pack_files(final))
    return (await rig.env.verify(workspace, WorkspaceState("final", tree.ref), LIMITS)).score


async def test_the_dockerfiles_path_does_not_reach_the_verifier(rig: Rig) -> None:
    path = "/app/.venv/bin:/usr/local/bin:/usr/bin:/bin"
    planted = {".venv/bin/python3": File(PASSES.encode(), executable=True)}
    assert await score(rig, planted, env_vars={"PATH": path}) == 0.0


async def test_the_dockerfiles_home_does_not_reach_the_verifier(rig: Rig) -> None:
    relative = user_site("/app").removeprefix("/app/")
    assert await score(rig, {f"{relative}/x.pth": PTH}, env_vars={"HOME": "/app"}) == 0.0


async def test_a_workspace_at_tmp_is_not_the_verifiers_home(rig: Rig) -> None:
    """The base HOME is /tmp: with WORKDIR /tmp it was the workspace itself."""
    relative = user_site("/tmp").removeprefix("/tmp/")
    assert await score(rig, {f"{relative}/x.pth": PTH}, workdir="/tmp") == 0.0


async def test_the_user_site_is_off_even_where_the_tasks_verifier_env_names_home(
    rig: Rig,
) -> None:
    relative = user_site("/app").removeprefix("/app/")
    check = Check(kind="script", env={"HOME": "/app"})
    assert await score(rig, {f"{relative}/x.pth": PTH}, check) == 0.0


@pytest.mark.parametrize("workdir", ["/app", "/tmp", "/tmp/.local"])
async def test_the_verifier_gets_its_env_and_a_fresh_home_the_steps_the_dockerfiles(
    rig: Rig, workdir: str
) -> None:
    outside = (  # HOME neither in the workspace nor above it
        f'case "$HOME/" in {workdir}/*) false ;; esac '
        f'&& case "{workdir}/" in "$HOME"/*) false ;; esac'
    )
    script = (
        f'[ "$FROM_TOML" = yes ] && [ -z "${{FROM_DOCKER+set}}" ] && [ "$PYTHONNOUSERSITE" = 1 ] '
        f'&& [ -z "$(ls -A "$HOME")" ] && touch "$HOME/written" && [ ! -e {workdir}/written ] '
        f"&& {outside} && echo 1 > {REWARD} || echo 0 > {REWARD}\n"
    )
    check = Check(kind="script", env={"FROM_TOML": "yes"})
    spec = rig.spec(
        {"a.txt": "a\n"}, {"test.sh": script}, check, workdir=workdir,
        env_vars={"FROM_DOCKER": "docker"},
    )  # fmt: skip
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 1.0, graded.result
    echo = ToolCall(name="bash", arguments={"command": 'echo "[$FROM_DOCKER]"'})
    _, seen = await rig.env.step(state, echo, LIMITS)
    assert "[docker]" in seen.text, seen.text
