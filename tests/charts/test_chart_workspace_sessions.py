"""Workspace sessions in the chart's sandbox pods (`sandbox.workspaceSessions`, opt-in).

A workspace session runs each tool command in bubblewrap on the sandbox worker's own host
(infra/sandbox/workspace.py), so serving them from the chart means the sandbox worker's pod runs
as root with what that needs and no more: CAP_SYS_ADMIN (each workspace's tmpfs and the start
script's proc mounts), CAP_SETUID/CAP_SETGID (setpriv to the session's uid), CAP_CHOWN (its
workspace is its uid's), CAP_DAC_OVERRIDE (the worker reads and writes the 0700 workspace) and
CAP_KILL (its processes run under that uid), with seccomp and AppArmor unconfined by default
(containerd's RuntimeDefault denies pivot_root, the runtime's AppArmor profile denies mount).
Off, every worker keeps uid 10001 with every capability dropped. The image carries bwrap and
setpriv either way. No API server runs here: the manifests are validated against the 1.33
schemas (tests/charts/test_chart.py, with ci/workspace-sessions-values.yaml), and what the start
script does was tried in a simulated container (README.md). Skipped without helm.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from infra.settings import WorkspaceSettings
from tests.charts.chart import (
    CHART,
    WORKERS,
    container,
    deployments,
    needs_helm,
    render,
    settings_from,
    worker_env,
)
from tests.paths import REPO_ROOT

pytestmark = needs_helm

SESSIONS = CHART / "ci" / "workspace-sessions-values.yaml"
CAPABILITIES = {"SYS_ADMIN", "SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "KILL"}
"""Exactly what the sandbox worker needs to serve workspace sessions (see the module's doc)."""


def pod(docs: list[dict[str, Any]], queue: str) -> dict[str, Any]:
    spec: dict[str, Any] = deployments(docs)[queue]["spec"]["template"]["spec"]
    return spec


def mounts(docs: list[dict[str, Any]], queue: str) -> dict[str, str]:
    """{volume name: mount path} of a worker's container."""
    return {m["name"]: m["mountPath"] for m in container(deployments(docs)[queue])["volumeMounts"]}


def test_by_default_every_worker_is_uid_10001_with_every_capability_dropped() -> None:
    docs = render()
    for queue in WORKERS:
        spec, worker = pod(docs, queue), container(deployments(docs)[queue])
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "appArmorProfile" not in spec["securityContext"]
        assert worker["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert "command" not in worker  # the image's `tini -- tempered`
        assert {"workspaces", "visible-proc"}.isdisjoint(mounts(docs, queue))


def test_with_workspace_sessions_the_sandbox_worker_gets_exactly_its_capabilities() -> None:
    docs = render(SESSIONS)
    spec, worker = pod(docs, "sandbox"), container(deployments(docs)["sandbox"])
    assert spec["securityContext"] == {
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "seccompProfile": {"type": "Unconfined"},
        "appArmorProfile": {"type": "Unconfined"},
    }
    context = worker["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    assert len(context["capabilities"]["add"]) == len(CAPABILITIES)
    assert set(context["capabilities"]["add"]) == CAPABILITIES
    assert context["readOnlyRootFilesystem"] is True
    # Kubernetes holds it true beside CAP_SYS_ADMIN; setpriv --nnp covers every command
    assert context["allowPrivilegeEscalation"] is True
    assert "privileged" not in context and "procMount" not in context
    assert "hostUsers" not in spec  # session uids lie far above a pod user namespace's 65,536
    for name in ("hostPID", "hostIPC", "hostNetwork", "shareProcessNamespace"):
        assert name not in spec
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    # every other worker is as before
    for queue in set(WORKERS) - {"sandbox"}:
        if queue in deployments(docs):
            assert pod(docs, queue)["securityContext"]["runAsUser"] == 10001
            caps = container(deployments(docs)[queue])["securityContext"]["capabilities"]
            assert caps == {"drop": ["ALL"]}


def test_the_start_script_mounts_on_the_pods_volumes_then_runs_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(SESSIONS)
    worker = container(deployments(docs)["sandbox"])
    shell, flag, script, name = worker["command"]
    assert (shell, flag, name) == ("/bin/sh", "-c", "tempered")
    assert worker["args"] == ["worker", "sandbox"]  # "$@" of the script
    assert script.splitlines()[0] == "set -eu"
    assert script.rstrip().splitlines()[-1] == 'exec /usr/bin/tini -- tempered "$@"'
    paths = mounts(docs, "sandbox")
    proc = re.search(r"subset=pid proc (\S+)", script)
    assert proc and proc[1] == paths["visible-proc"]
    assert "mount -o remount,bind,rw,nosuid,nodev,noexec /proc/sys/user" in script
    volumes = {v["name"]: v for v in pod(docs, "sandbox")["volumes"]}
    assert volumes["workspaces"]["emptyDir"] == {"sizeLimit": "2Gi"}
    # the worker keeps its workspaces on that volume, each a tmpfs of its own (or it fails)
    workspaces = settings_from(worker_env(docs, "sandbox"), monkeypatch).sandbox.workspaces
    assert isinstance(workspaces, WorkspaceSettings)
    assert (str(workspaces.root), workspaces.disk) == (paths["workspaces"], "tmpfs")
    assert workspaces.max_workspace_mb == 128


def test_localhost_profiles_replace_unconfined() -> None:
    docs = render(
        SESSIONS,
        "sandbox.workspaceSessions.seccompProfile.type=Localhost",
        "sandbox.workspaceSessions.seccompProfile.localhostProfile=profiles/tempered-bwrap.json",
        "sandbox.workspaceSessions.appArmorProfile.type=Localhost",
        "sandbox.workspaceSessions.appArmorProfile.localhostProfile=tempered-bwrap",
    )
    context = pod(docs, "sandbox")["securityContext"]
    assert context["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "profiles/tempered-bwrap.json",
    }
    assert context["appArmorProfile"] == {"type": "Localhost", "localhostProfile": "tempered-bwrap"}


@pytest.mark.parametrize(
    "profile",
    [
        ("seccompProfile.type=Localhost",),
        ("appArmorProfile.type=Localhost",),
        ("seccompProfile.type=Unconfined", "seccompProfile.localhostProfile=p.json"),
        ("appArmorProfile.type=RuntimeDefault", "appArmorProfile.localhostProfile=p"),
    ],
)
def test_a_profile_the_api_server_would_refuse_is_refused_by_the_schema(
    profile: tuple[str, ...],
) -> None:
    """`localhostProfile` exactly with `Localhost`, as Kubernetes requires: `helm install`
    passed these, and the pods were refused at creation."""
    sets = [f"sandbox.workspaceSessions.{item}" for item in profile]
    with pytest.raises(AssertionError, match=profile[0].split(".")[0]):
        render.__wrapped__(SESSIONS, *sets)


def test_the_image_has_bubblewrap_and_setpriv() -> None:
    """The image the chart runs carries what a workspace session runs (the Dockerfile's other
    checks are tests/test_packaging.py's)."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    runtime = text[text.index("AS runtime") :]
    install = re.search(r"apt-get install[^&]*", runtime)
    assert install, "the runtime stage installs no packages"
    packages = set(install[0].replace("\\", " ").split())
    assert {"bubblewrap", "util-linux", "mount", "tini"} <= packages


def test_the_readme_says_what_the_pod_may_do() -> None:
    readme = (CHART / "README.md").read_text()
    section = readme[readme.index("## Workspace sessions") :]
    section = section[: section.index("\n## ", 1)]
    for capability in CAPABILITIES:
        assert f"CAP_{capability}" in section
    for words in ("workspaceSessions.enabled", "hostUsers: false", "pivot_root", "Unconfined"):
        assert words in section, words
    assert "are not served here" not in readme


@pytest.mark.parametrize("disk", [None, "tmpfs", "directory"])
def test_what_a_workspace_is_comes_from_its_value(disk: str | None) -> None:
    """`sandbox.workspaceSessions.disk` (a worker's env may not set the variable the chart
    writes): a tmpfs of each workspace by default, or a directory of the emptyDir."""
    docs = render(SESSIONS, *([f"sandbox.workspaceSessions.disk={disk}"] if disk else []))
    assert worker_env(docs, "sandbox")["TEMPERED_SANDBOX__WORKSPACES__DISK"] == (disk or "tmpfs")
