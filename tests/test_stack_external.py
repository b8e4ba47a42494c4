"""A Temporal that is not the embedded dev server (`temporal.embedded = false`): a cluster, or a
server of the user's own. `up` starts none there (nor the codec server of its UI), `down`
leaves it running, `status` says whether it answers, and `train` / `train --attach` run
against it; the embedded default still calls a foreign listener on its port a clash.

The external Temporal is the suite's dev server (`temporal_server`); S3 is set external too,
so these tests start no process of their own."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from rich.console import Console

from infra import stack
from infra.processes import free_port, port_open
from infra.settings import S3Settings, Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workers.cli.status import StatusReport, render


def settings_for(
    home: Path, address: str, *, embedded: bool, namespace: str = "default"
) -> Settings:
    return Settings(
        home=home,
        temporal=TemporalSettings(
            address=address,
            namespace=namespace,
            embedded=embedded,
            ui_port=free_port(),
            http_port=free_port(),
            codec_port=free_port(),
        ),
        s3=S3Settings(endpoint="https://s3.example.com"),
    )


def test_up_and_down_leave_an_external_temporal_as_it_is(
    temporal_server: TemporalServer, tmp_path: Path
) -> None:
    address = temporal_server.address
    settings = settings_for(tmp_path, address, embedded=False)

    lines = stack.up(settings)
    assert lines[0] == f"temporal: external at {address} (not started)"
    assert lines[2].startswith("codec: not started"), lines
    assert list((tmp_path / "run").glob("*.pid")) == []  # nothing of ours runs
    assert stack.status(settings)["temporal"] == f"external at {address}, answering"

    assert stack.down(settings)[1] == f"temporal: external at {address}, left running"
    assert temporal_server.process.poll() is None
    host, port = address.rsplit(":", 1)
    assert port_open(host, int(port))


def test_train_attach_runs_against_an_external_temporal(
    temporal_server: TemporalServer,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It reaches the server and asks it for the run (which does not exist): before, `stack.up`
    called the server a port clash and nothing was asked."""
    settings = settings_for(tmp_path, temporal_server.address, embedded=False, namespace=namespace)
    code = run(["train", "--attach", "no-such-run", "--no-workers"], settings)
    out, err = capsys.readouterr()
    assert f"temporal: external at {temporal_server.address} (not started)" in out
    assert code == 2 and "no training run 'no-such-run'" in err, err
    assert list((tmp_path / "run").glob("*.pid")) == []


def test_train_dry_run_names_an_external_temporal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for(tmp_path, "temporal.example.com:7233", embedded=False)
    assert run(["train", "--preset", "tiny", "--dry-run"], settings) == 0
    out = capsys.readouterr().out
    assert '"temporal": "temporal.example.com:7233 (external)"' in out
    assert '"temporal_ui": null' in out


def test_an_external_temporal_that_does_not_answer_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "LISTEN_WAIT_S", 0.3)
    address = f"127.0.0.1:{free_port()}"
    settings = settings_for(tmp_path, address, embedded=False)
    with pytest.raises(stack.StackError, match=f"nothing answers at {address}"):
        stack.up(settings)
    assert stack.status(settings)["temporal"] == f"external at {address}, not answering"


def test_the_embedded_default_still_calls_a_foreign_listener_a_clash(tmp_path: Path) -> None:
    port = free_port()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        settings = settings_for(tmp_path, f"127.0.0.1:{port}", embedded=True)
        with pytest.raises(stack.StackError) as raised:
            stack.up(settings)
        message = str(raised.value)
        assert f"port 127.0.0.1:{port} is taken by another process" in message
        assert "TEMPERED_TEMPORAL__EMBEDDED=false" in message  # the way to use it as it is
        assert stack.status(settings)["temporal"] == "stopped"
    finally:
        squatter.close()


def test_status_does_not_suggest_up_for_an_external_temporal() -> None:
    def shown(external: bool) -> str:
        console = Console(record=True, width=200)
        report = StatusReport(
            home="/h",
            services={"temporal": "x"},
            temporal="temporal.example.com:7233",
            temporal_external=external,
        )
        render(report, console)
        return console.export_text()

    assert "cannot reach Temporal at temporal.example.com:7233 (external)" in shown(True)
    assert "`tempered up`?" in shown(False)
