"""bench/episodes.py removes its stack's folder (SeaweedFS's and Temporal's data) however a run
ends: it was removed only after a run that merged its results, so every failed or refused run
(a busy machine's SystemExit among them) left it in /tmp. The stack is down before it goes."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest

from infra.settings import Settings


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) == 0


def test_a_run_that_fails_leaves_no_folder_and_no_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import episodes

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the bench's folders land here
    seen: list[Settings] = []

    async def refused(settings: Settings, steps: int) -> dict[str, Any]:
        seen.append(settings)
        assert settings.home is not None and settings.home.parent == scratch
        assert _listening(settings.temporal.address)  # the real stack is up
        raise SystemExit("machine busy at snapshot: other processes' CPU 0.61 per core > 0.5")

    monkeypatch.setattr(episodes, "snapshot_cost", refused)
    with pytest.raises(SystemExit, match="machine busy"):
        asyncio.run(episodes.main(episodes.parse_args(["--episodes", "1", "--concurrency", "1"])))
    assert len(seen) == 1
    assert not _listening(seen[0].temporal.address)
    assert [p.name for p in scratch.iterdir()] == []
