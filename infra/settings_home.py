"""The guard on a settings file's relative `home`, which moved with an upgrade: it is read
against the settings file's own folder (infra/settings_env.py), where a release before read it
against the working directory. Run from another folder after the upgrade, such a file named a
new, empty home, and the user's runs seemed gone.

    check_moved_home("state", Path("/proj/tempered.toml"))   # ValueError where the runs stayed

It refuses only where the old reading (`cwd/home`) holds Tempered state and the new one
(`folder/home`) holds none, naming both and how to pin one with an absolute path. It creates
nothing, and does not look at a home given by an argument or `TEMPERED_HOME` (read against the
working directory, as they always were), nor at an absolute one.
"""

from __future__ import annotations

from pathlib import Path

HOME_STATE = ("temporal.db", "seaweed", "reports")
"""What in a home keeps a user's runs: the embedded Temporal's histories and SeaweedFS's objects
(infra/stack.py), the runs' reports (`tempered train`). Logs, pidfiles and caches are no runs."""


def state_in(home: Path) -> list[str]:
    """The entries of `HOME_STATE` that `home` holds."""
    return [name for name in HOME_STATE if (home / name).exists()]


def check_moved_home(given: str, settings_file: Path) -> None:
    """ValueError where the settings file's `home` value `given`, relative, names a home with no
    Tempered state against the file's folder but one with state against the working directory."""
    path = Path(given).expanduser()
    if not given or path.is_absolute():
        return
    new, old = (settings_file.absolute().parent / path).resolve(), (Path.cwd() / path).resolve()
    if new == old or state_in(new) or not (found := state_in(old)):
        return
    raise ValueError(
        f"settings file {settings_file.resolve()} gives home = {given!r}, now read against the file's "
        f"folder: {new}, which holds no Tempered state; read against the working directory, as "
        f"before, it is {old}, which holds {', '.join(found)}. Pin the one meant with an "
        f'absolute path in that file: home = "{old}" keeps those runs, home = "{new}" starts '
        "afresh"
    )
