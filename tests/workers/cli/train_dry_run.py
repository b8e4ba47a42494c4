"""`tempered train --dry-run` as the journey tests run it: the real CLI's plan of a run, with an
S3 nothing listens at (the run id is left unchecked, and the dry run says so), no server needed.

`settings` is a fixture: a test module imports it as `settings as settings`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import Settings
from tests.fixtures.cli_settings import cli_settings, nowhere_endpoint
from workers.cli import run


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Home `tmp_path/home`; an S3 nothing listens at (no store: the dry run says so)."""
    return cli_settings(tmp_path / "home", endpoint=nowhere_endpoint())


def dry_run(
    argv: list[str], settings: Settings, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """`tempered train ARGV --dry-run`: (exit code, stderr with its whitespace folded, stdout)."""
    code = run(["train", *argv, "--dry-run"], settings)
    captured = capsys.readouterr()
    return code, " ".join(captured.err.split()), captured.out
