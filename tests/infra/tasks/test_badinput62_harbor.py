"""Bad input to the Harbor loader that once passed silently: a misspelt `[metadata] split` (a
held-out task loaded as train, and trained on) and `harbor:` with no directory (the working
directory read as the suite). Real task directories under `tmp_path`, no mocks."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from infra.tasks import absolute_suite, load_suite, suite_key
from infra.tasks.harbor import harbor_tasks, load_harbor
from tests.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "harbor" / "fix-greeting"


def copied(tmp_path: Path, name: str, toml: str | None = None) -> Path:
    """The fix-greeting example at `tmp_path/name`, with `toml` appended to its task.toml."""
    directory = Path(shutil.copytree(EXAMPLE, tmp_path / name))
    if toml is not None:
        path = directory / "task.toml"
        path.write_text(path.read_text().replace("[metadata]\n", f"[metadata]\n{toml}"))
    return directory


@pytest.mark.parametrize("key", ["spilt", "splt", "Split", "splits"])
def test_a_misspelt_metadata_split_is_the_tasks_error(tmp_path: Path, key: str) -> None:
    """`spilt = "heldout"` loaded as split train, with no word: a held-out task trained on."""
    copied(tmp_path, "good")
    copied(tmp_path, "bad", toml=f'{key} = "heldout"\n')
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"], errors
    message = rf"task bad: \S+/bad/task.toml: \[metadata\] {key}: no such key; did you mean split\?"
    assert re.match(message, errors["bad"]), errors["bad"]


def test_other_metadata_keys_and_the_split_itself_still_load(tmp_path: Path) -> None:
    """Harbor's [metadata] is free-form (difficulty, category, tags, author_name, ...): only a
    close misspelling of the one key Tempered reads is an error."""
    copied(tmp_path, "held", toml='split = "heldout"\nauthor_name = "x"\nsplit_note = "y"\n')
    tasks, errors = load_harbor(tmp_path)
    assert not errors and [(t.spec.id, t.spec.split) for t in tasks] == [("held", "heldout")]


@pytest.mark.parametrize("suite", ["harbor:", "harbor: "])
def test_harbor_with_no_directory_is_refused_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suite: str
) -> None:
    """`--suite harbor:` read the working directory (here one holding a task: it loaded)."""
    copied(tmp_path, "here")
    monkeypatch.chdir(tmp_path)
    for call in (
        lambda: load_suite(suite),
        lambda: absolute_suite(suite),
        lambda: suite_key(suite),
        lambda: list(harbor_tasks(suite.removeprefix("harbor:"))),
        lambda: load_harbor(suite.removeprefix("harbor:")),
    ):
        with pytest.raises(ValueError, match=r"^harbor:DIR needs a directory"):
            call()
    assert absolute_suite("harbor:.") == f"harbor:{tmp_path.resolve()}"  # named: still read
