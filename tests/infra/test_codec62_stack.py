"""The codec server `tempered up` runs (infra/stack.py `_start_codec`, a real `python -m
infra.codec`): it answers the UI that `up` prints, wherever the Temporal host is (0.0.0.0, a LAN
address: only 127.0.0.1 and localhost were allowed, so that UI got 403); and one that runs with
other S3 settings (another bucket) is restarted with these, not reused: it read the old bucket,
and the UI said "no stored object matches the reference"."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import stack
from infra.processes import free_port
from infra.settings import Settings, TemporalSettings
from infra.stack_services import temporal_ui
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer

PROGRAM = "def add(a, b):\n    return a + b\n"


def settings_at(home: Path, host: str = "127.0.0.1", **s3: Any) -> Settings:
    temporal = TemporalSettings(
        address=f"{host}:{free_port()}", ui_port=free_port(), codec_port=free_port()
    )
    base = Settings(home=home, temporal=temporal)
    return base.model_copy(update={"s3": base.s3.model_copy(update=s3)})


@pytest.fixture
def codec_home(tmp_path: Path) -> Iterator[Path]:
    """A home whose codec server, if a test starts one, is stopped after it."""
    home = tmp_path / "home"
    try:
        yield home
    finally:
        stack.codec_service(Settings(home=home)).stop()


def decode(settings: Settings, origin: str, value: Any) -> tuple[int, Any]:
    """POST /decode of one JSON payload to the codec server `settings` place: its status, and
    the payload's value as decoded (None unless 200)."""
    data = base64.b64encode(json.dumps(value).encode()).decode()
    encoding = base64.b64encode(b"json/plain").decode()
    body = json.dumps({"payloads": [{"metadata": {"encoding": encoding}, "data": data}]})
    request = urllib.request.Request(
        f"http://127.0.0.1:{settings.temporal.codec_port}/decode",
        data=body.encode(),
        headers={"Origin": origin, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            (decoded,) = json.loads(response.read())["payloads"]
            return response.status, json.loads(base64.b64decode(decoded["data"]))
    except urllib.error.HTTPError as error:
        return error.code, None


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10"])
def test_the_ui_up_prints_is_answered(codec_home: Path, host: str) -> None:
    settings = settings_at(codec_home, host)
    assert stack._start_codec(settings).startswith("codec: started at ")
    ui = temporal_ui(settings)
    assert ui == f"http://{host}:{settings.temporal.ui_port}"
    assert decode(settings, ui, {"a": 1}) == (200, {"a": 1})
    assert decode(settings, f"http://127.0.0.1:{settings.temporal.ui_port}", {"a": 1})[0] == 200
    assert decode(settings, "http://evil.example", {"a": 1}) == (403, None)


def test_a_codec_running_with_another_bucket_is_restarted_with_these_settings(
    codec_home: Path, seaweed: SeaweedServer, store: ObjectStore
) -> None:
    other = seaweed.store()
    try:
        ref = other.put_text("runs/r/code.py", PROGRAM).model_dump()
        s3 = seaweed.settings.model_dump()
        first = settings_at(codec_home, **(s3 | {"bucket": store.bucket}))
        service = stack.codec_service(first)
        assert stack._start_codec(first).startswith("codec: started at ")
        was = service.pid()
        ui = f"http://127.0.0.1:{first.temporal.ui_port}"
        assert "content_error" in decode(first, ui, {"ref": ref})[1]["payload"]["ref"]
        these = settings_at(codec_home, **(s3 | {"bucket": other.bucket}))
        these = these.model_copy(update={"temporal": first.temporal})
        line = stack._start_codec(these)
        assert "restarted" in line and "S3" in line, line
        assert service.pid() not in (None, was), line
        status, decoded = decode(these, ui, {"ref": ref})
        assert status == 200 and decoded["payload"]["ref"].get("content") == PROGRAM, decoded
        again = service.pid()
        assert stack._start_codec(these).startswith("codec: already running at ")
        assert service.pid() == again  # the same settings: left running
        secret = seaweed.settings.secret_key.get_secret_value()
        assert secret not in service.pidfile.read_text()
    finally:
        seaweed.drop(other.bucket)
