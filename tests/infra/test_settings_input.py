"""What `load_settings` refuses before or while it builds the model, each as one line naming
the file or the variable: a settings file it cannot read, a `TEMPERED_` variable that names no
setting (pydantic-settings ignores it), an empty path, nan and inf, a section that is not JSON.

Every test runs in an empty working directory with no `TEMPERED_*` variables set.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.settings import Settings, load_settings
from infra.settings_env import check_environment
from tests.paths import REPO_ROOT

pytestmark = pytest.mark.usefixtures("clean")  # tests/fixtures/settings_env.py


def refusal(monkeypatch: pytest.MonkeyPatch, how: str, path: Path) -> str:
    """The one-line error of loading the settings file `path`, named as `how` says."""
    if how == "env":
        monkeypatch.setenv("TEMPERED_CONFIG", str(path))
    with pytest.raises(ValueError) as caught:
        load_settings(path if how == "argument" else None)
    message = str(caught.value)
    assert "\n" not in message
    return message


def unreadable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Reading `path` fails as a file mode 000 does (the tests may run as root, who reads it)."""
    path.write_text('[s3]\nbucket = "abc"\n')
    real_open = Path.open

    def open_or_deny(self: Path, *args: object, **kwargs: object) -> object:
        if self.absolute() == path.absolute():
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", open_or_deny)


@pytest.mark.parametrize("how", ["argument", "env", "implicit"])
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("unreadable", "(Permission denied)"),
        ("directory", "(a directory)"),
        ("latin-1", "(not UTF-8: invalid start byte at byte 7)"),
    ],
)
def test_a_settings_file_that_cannot_be_read_is_one_line_naming_it(
    clean: Path, monkeypatch: pytest.MonkeyPatch, how: str, kind: str, reason: str
) -> None:
    """Unreadable: a PermissionError traceback for every command; not UTF-8: "'utf-8' codec
    can't decode byte 0xff", naming no file; a directory: "does not exist" (or, as
    ./tempered.toml, ignored)."""
    path = clean / ("tempered.toml" if how == "implicit" else "my.toml")
    if kind == "unreadable":
        unreadable(monkeypatch, path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"[s3]\n# \xff\n")
    message = refusal(monkeypatch, how, path)
    assert message.startswith(f"{path}: cannot read settings file {reason}"), message
    assert ("read implicitly" in message) is (how == "implicit"), message


def test_a_settings_file_that_is_not_there_is_still_named() -> None:
    with pytest.raises(ValueError, match=r"^settings file missing\.toml does not exist$"):
        load_settings("missing.toml")


def test_an_implicitly_read_settings_file_is_named_in_its_errors(clean: Path) -> None:
    """`tempered status` in a directory holding someone else's tempered.toml said only "bad
    configuration: tool: Extra inputs are not permitted"."""
    (clean / "tempered.toml").write_text("[tool.something]\nx = 1\n")
    with pytest.raises(ValueError) as caught:
        load_settings()
    assert str(caught.value).startswith("tool: Extra inputs are not permitted")
    assert f"(settings file {clean / 'tempered.toml'}, read implicitly" in str(caught.value)
    (clean / "tempered.toml").write_text("[sandbox]\nconcurrency = x\n")
    with pytest.raises(ValueError, match=r": not valid TOML .*; it was read implicitly"):
        load_settings()
    (clean / "named.toml").write_text("[sandbox]\nconcurrency = 0\n")
    with pytest.raises(ValueError) as caught:
        load_settings(clean / "named.toml")
    assert "read implicitly" not in str(caught.value)  # the caller knows which file it named


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("TEMPERED_TEMPORAL_ADDRESS", "TEMPERED_TEMPORAL__ADDRESS"),
        ("TEMPERED_LEARNER_DEVICE", "TEMPERED_LEARNER__DEVICE"),
        ("tempered_learner_device", "TEMPERED_LEARNER__DEVICE"),
        ("TEMPERED_SANDBOX_KUBERNETES__IMAGE", "TEMPERED_SANDBOX__KUBERNETES__IMAGE"),
        ("TEMPERED__S3__BUCKET", "TEMPERED_S3__BUCKET"),
        ("TEMPERED_INFERNCE__MAX_ACTIVITIES", "TEMPERED_INFERENCE__MAX_ACTIVITIES"),
        ("TEMPERED_OMP_SPINCOUNT", "TEMPERED_OMP_SPIN_COUNT"),
        ("TEMPERED_HOME__PATH", None),
        ("TEMPERED_WORKER", None),
    ],
)
def test_a_variable_that_names_no_setting_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, suggestion: str | None
) -> None:
    """pydantic-settings ignores a TEMPERED_ variable whose first part is no field: one `_`
    where the nesting needs `__` passed without a word (a typo after `__` is extra="forbid")."""
    monkeypatch.setenv(name, "cuda" if "DEVICE" in name.upper() else "h:1")
    with pytest.raises(ValueError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"environment variable {name} names no setting"), message
    assert "\n" not in message
    if suggestion:
        assert f"did you mean {suggestion}?" in message
    else:
        assert "did you mean" not in message and "TEMPERED_<SECTION>__<FIELD>" in message


def test_every_bad_variable_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_TEMPORAL_ADDRESS", "foo:1")
    monkeypatch.setenv("TEMPERED_LEARNER_DEVICE", "cuda")
    with pytest.raises(ValueError) as caught:
        load_settings()
    assert re.fullmatch(
        r"environment variable TEMPERED_LEARNER_DEVICE names .*; "
        r"environment variable TEMPERED_TEMPORAL_ADDRESS names [^;]*",
        str(caught.value),
    ), caught.value


def test_the_variables_the_code_sets_that_are_not_settings_still_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chart's pod id, a sandbox Job's own (it loads no settings; a worker inheriting them
    must still start), and the tests' switches (a test's workers inherit them)."""
    for name, value in [
        ("TEMPERED_WORKER_ID", "workers-sandbox-7c9f"),
        ("TEMPERED_RUN", "{}"),
        ("TEMPERED_RESULT_NONCE", "n"),
        ("TEMPERED_JOB_12", "}"),
        ("TEMPERED_JOB_0", "{}"),
        ("TEMPERED_RECORD_HISTORIES", "1"),
        ("TEMPERED_LOAD_TASKS", "50"),
        ("TEMPERED_SANDBOX__CONCURRENCY", "3"),
        ("TEMPERED_OMP_SPIN_COUNT", "0"),
        ("tempered_s3__bucket", "lower"),  # pydantic-settings reads names in any case
    ]:
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert (settings.sandbox.concurrency, settings.omp_spin_count) == (3, 0)
    assert settings.s3.bucket == "lower"
    monkeypatch.setenv("TEMPERED_JOB_X", "{}")  # only the numbered chunks are the Job's
    with pytest.raises(ValueError, match="TEMPERED_JOB_X names no setting"):
        load_settings()


def test_every_variable_the_code_chart_and_image_set_passes_the_check() -> None:
    """The chart's ConfigMap, Secret and pod env, the Dockerfile and the code that starts
    processes: a worker given any of them must start (a name here the check refuses would stop
    every pod)."""
    sources = [REPO_ROOT / "Dockerfile", REPO_ROOT / "Makefile"]
    sources += sorted((REPO_ROOT / "charts").rglob("*"))
    for package in ("activities", "contracts", "infra", "workers", "workflows"):
        sources += sorted((REPO_ROOT / package).rglob("*.py"))
    names = set()
    for path in sources:
        if path.is_file() and path.name != "settings_env.py":  # its docstring shows typos
            text = path.read_text(encoding="utf-8", errors="replace")
            names.update(re.findall(r"\bTEMPERED_[A-Z0-9_]*[A-Z0-9]\b", text))
    names |= {"TEMPERED_JOB_0"}  # chunked: the code names its prefix
    assert {"TEMPERED_HOME", "TEMPERED_WORKER_ID", "TEMPERED_S3__SECRET_KEY"} <= names
    check_environment(Settings, dict.fromkeys(sorted(names), "x"))


@pytest.mark.parametrize(
    "name", ["TEMPERED_HOME", "TEMPERED_CONFIG", "TEMPERED_SANDBOX__WORKSPACES__ROOT"]
)
def test_an_empty_path_variable_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """An empty TEMPERED_HOME made the working directory home (its pids, logs, databases); an
    empty workspace root, the working directory the sandbox worker cleans at start."""
    monkeypatch.setenv(name, "")
    with pytest.raises(ValueError, match=f"^environment variable {name} is empty: unset it or "):
        load_settings()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_nan_and_inf_are_refused_as_such(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """`nan` was "should be less than or equal to 120" (every comparison with nan fails)."""
    monkeypatch.setenv("TEMPERED_S3__CONNECT_TIMEOUT_S", value)
    with pytest.raises(ValueError, match=r"^s3\.connect_timeout_s: Input should be a finite"):
        load_settings()
    monkeypatch.delenv("TEMPERED_S3__CONNECT_TIMEOUT_S")
    with pytest.raises(ValueError, match=r"^learner\.start_timeout_s: Input should be a finite"):
        load_settings(learner={"start_timeout_s": float(value)})


@pytest.mark.parametrize(
    ("name", "value"),
    [("TEMPERED_TEMPORAL", "{bad"), ("TEMPERED_SANDBOX__KUBERNETES", "{bad"),
     ("TEMPERED_S3", '"abc"'), ("TEMPERED_SANDBOX", "[]")],
)  # fmt: skip
def test_a_section_set_whole_must_be_a_json_object(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """`{bad` was pydantic-settings' "error parsing value for field "temporal" from source
    "EnvSettingsSource"", naming no variable."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        load_settings()
    assert str(caught.value).startswith(
        f"environment variable {name} is not a JSON object (set a section whole as "
    ), caught.value


def test_a_section_set_whole_as_json_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_TEMPORAL", '{"address": "h:1", "embedded": false}')
    monkeypatch.setenv("TEMPERED_SANDBOX__KUBERNETES", '{"image": "py:3"}')
    settings = load_settings()
    assert (settings.temporal.address, settings.temporal.embedded) == ("h:1", False)
    assert settings.sandbox.kubernetes.image == "py:3"
