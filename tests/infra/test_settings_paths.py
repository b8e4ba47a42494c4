"""Paths in the settings are absolute once loaded, by one rule: `~` is expanded; a relative path
in a TOML file is relative to that file's directory; one from an environment variable or an
argument, to the working directory. `home`, `config` and `sandbox.workspaces.root` alike.

Before, `home = "state"` in /proj/tempered.toml was ./state of whatever directory the command
ran in, a relative workspace root stayed relative (a background worker, started in `home`, and
a foreground one each found their own), and `~` stayed a directory named `~`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (`cwd`), a project directory beside it, no TEMPERED_*."""
    for name in [n for n in os.environ if n.upper().startswith("TEMPERED_")]:
        monkeypatch.delenv(name)
    (tmp_path / "cwd").mkdir()
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return tmp_path


def _paths(settings: Settings) -> tuple[Path, Path]:
    return settings.home, settings.sandbox.workspaces.root


TOML = """home = "state"\n[sandbox.workspaces]\nroot = "ws"\n"""


@pytest.mark.parametrize("how", ["argument", "env"])
def test_a_relative_path_in_a_toml_file_is_relative_to_the_file(
    clean: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    config = clean / "proj" / "tempered.toml"
    config.write_text(TOML)
    if how == "env":
        monkeypatch.setenv("TEMPERED_CONFIG", "../proj/tempered.toml")
    settings = load_settings(config if how == "argument" else None)
    assert settings.config is not None and settings.config.resolve() == config
    home, root = _paths(settings)  # absolute, ".." kept: a symlink before it may point anywhere
    assert (home.resolve(), root.resolve()) == (clean / "proj" / "state", clean / "proj" / "ws")


def test_the_working_directorys_own_file_is_relative_to_it(clean: Path) -> None:
    (clean / "cwd" / "tempered.toml").write_text(TOML)
    assert _paths(load_settings()) == (clean / "cwd" / "state", clean / "cwd" / "ws")


def test_a_relative_path_from_the_environment_or_an_argument_is_the_working_directorys(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = clean / "proj" / "tempered.toml"
    config.write_text(TOML)
    monkeypatch.setenv("TEMPERED_HOME", "env-state")
    monkeypatch.setenv("TEMPERED_SANDBOX__WORKSPACES__ROOT", "env-ws")
    cwd = clean / "cwd"
    assert _paths(load_settings(config)) == (cwd / "env-state", cwd / "env-ws")  # env > file
    given = load_settings(config, home="arg", sandbox={"workspaces": {"root": "arg-ws"}})
    assert _paths(given) == (cwd / "arg", cwd / "arg-ws")


def test_a_tilde_is_the_users_home_from_every_source(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = clean / "user"
    config = clean / "proj" / "tempered.toml"
    config.write_text('home = "~/state"\n[sandbox.workspaces]\nroot = "~/ws"\n')
    assert _paths(load_settings(config)) == (user / "state", user / "ws")
    monkeypatch.setenv("TEMPERED_SANDBOX__WORKSPACES__ROOT", "~/env-ws")
    assert load_settings(config).sandbox.workspaces.root == user / "env-ws"
    assert load_settings(home="~/arg").home == user / "arg"


def test_an_absolute_path_is_kept_and_the_default_root_is_absolute(clean: Path) -> None:
    config = clean / "proj" / "tempered.toml"
    config.write_text('home = "/srv/state"\n[sandbox.workspaces]\nroot = "/srv/ws"\n')
    assert _paths(load_settings(config)) == (Path("/srv/state"), Path("/srv/ws"))
    assert load_settings().sandbox.workspaces.root.is_absolute()


# A release before read a settings file's relative `home` against the working directory: a
# command run from there after the upgrade found a new, empty home beside the file, and the
# user's runs seemed gone. Where only that old reading holds Tempered state, loading warns,
# naming both folders and how to pin one (a refusal also stopped a new settings file meant to
# start afresh beside its own home, used from a folder where `make train` once ran).


def _moved(clean: Path, state: str = "temporal.db") -> tuple[Path, Path, Path]:
    """proj/tempered.toml with `home = "state"`, run from cwd/, whose ./state holds `state`."""
    config = clean / "proj" / "tempered.toml"
    config.write_text(TOML)
    old, new = clean / "cwd" / "state", clean / "proj" / "state"
    (old / state).parent.mkdir(parents=True, exist_ok=True)
    (old / state).mkdir() if state == "seaweed" else (old / state).write_text("")
    return config, old, new


@pytest.mark.parametrize("state", ["temporal.db", "seaweed", "reports/r1/report.json"])
def test_a_relative_home_whose_state_is_only_where_the_working_directory_put_it_is_named(
    clean: Path, state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config, old, new = _moved(clean, state)
    assert load_settings(config).home == new
    said = capsys.readouterr().err
    assert str(config) in said and str(old) in said and str(new) in said
    assert "absolute path" in said and f'home = "{old}"' in said
    assert not new.exists()  # nothing made on the way
    load_settings(config)
    assert capsys.readouterr().err == ""  # once a process: a command loads its settings often


def test_a_moved_home_is_not_named_once_the_new_one_has_state_or_the_old_one_has_none(
    clean: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, old, new = _moved(clean)
    (old / "temporal.db").unlink()
    (old / "logs").mkdir()  # not state: no run is kept there
    assert load_settings(config).home == new
    (old / "temporal.db").write_text("")
    (new / "seaweed").mkdir(parents=True)
    assert load_settings(config).home == new
    assert capsys.readouterr().err == ""


def test_a_moved_home_is_not_named_when_pinned_or_given_elsewhere(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, old, new = _moved(clean)
    assert load_settings(config, home=old).home == old
    monkeypatch.setenv("TEMPERED_HOME", str(new))
    assert load_settings(config).home == new
    monkeypatch.delenv("TEMPERED_HOME")
    config.write_text(f'home = "{new}"\n')
    assert load_settings(config).home == new
    monkeypatch.chdir(clean / "proj")  # the file's folder is the working directory: one reading
    (new / "temporal.db").parent.mkdir()
    config.write_text('home = "state"\n')
    assert load_settings(config).home == new
