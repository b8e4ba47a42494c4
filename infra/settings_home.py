"""The guard on a settings file's relative `home`, which moved with an upgrade: it is read
against the settings file's own folder (infra/settings_env.py), where a release before read it
against the working directory. Run from another folder after the upgrade, such a file named a
new, empty home, and the user's runs seemed gone.

    warn_moved_home("state", Path("/proj/tempered.toml"))   # on stderr where the runs stayed

It warns only where the old reading (`cwd/home`) holds Tempered state and the new one
(`folder/home`) holds none, naming both and how to pin one with an absolute path; once a
process and file. A warning, not a refusal: a new settings file beside its own new home, used
from a folder where `make train` once ran (`home = ".tempered"`), is the same picture and is
meant; refusing it stopped every command, `down` and `status` too. It creates nothing, and does
not look at a home given by an argument or `TEMPERED_HOME` (read against the working directory,
as they always were), nor at an absolute one.
"""

from __future__ import annotations

import sys
from pathlib import Path

HOME_STATE = ("temporal.db", "seaweed", "reports")
"""What in a home keeps a user's runs: the embedded Temporal's histories and SeaweedFS's objects
(infra/stack.py), the runs' reports (`tempered train`). Logs, pidfiles and caches are no runs."""


def state_in(home: Path) -> list[str]:
    """The entries of `HOME_STATE` that `home` holds."""
    return [name for name in HOME_STATE if (home / name).exists()]


_warned: set[Path] = set()
"""Settings files this process has warned of (a CLI command loads its settings more than once)."""


def warn_moved_home(given: str, settings_file: Path) -> str | None:
    """Warn (stderr) where the settings file's `home` value `given`, relative, names a home with
    no Tempered state against the file's folder but one with state against the working
    directory; the warning, or None."""
    path = Path(given).expanduser()
    if not given or path.is_absolute():
        return None
    new, old = (settings_file.absolute().parent / path).resolve(), (Path.cwd() / path).resolve()
    if new == old or state_in(new) or not (found := state_in(old)):
        return None
    said = (
        f"warning: settings file {settings_file.resolve()} gives home = {given!r}, now read against the file's "
        f"folder: {new}, which holds no Tempered state; read against the working directory, as "
        f"before, it is {old}, which holds {', '.join(found)}. Pin the one meant with an "
        f'absolute path in that file: home = "{old}" keeps those runs, home = "{new}" starts '
        "afresh (this warning goes once you do)"
    )
    if settings_file.resolve() not in _warned:
        _warned.add(settings_file.resolve())
        print(said, file=sys.stderr)
    return said
