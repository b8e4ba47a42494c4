"""Ports of the embedded stack that collide: each was checked only for being taken, so an S3
endpoint on Temporal's HTTP port (or on one of SeaweedFS's own base ports) passed, and `up`
failed later, "SeaweedFS did not start: s3://tempered not found", after starting Temporal. Now
`check_ports` refuses two services on one port before anything starts, naming both settings;
a real `tempered up` on a private home and free ports starts nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import stack
from infra.settings import S3Settings, Settings, TemporalSettings
from infra.stack_ports import check_ports
from infra.stack_services import StackError
from tests.fixtures.stack import Stack


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[Stack]:
    home = tmp_path / "home"
    assert home.name == "home" and tmp_path in home.parents
    unstarted = Stack(home)
    yield unstarted
    unstarted.tempered("down", "--force")


def with_s3(settings: Settings, port: int) -> Settings:
    s3 = settings.s3.model_copy(update={"endpoint": f"http://127.0.0.1:{port}"})
    return settings.model_copy(update={"s3": s3})


def refusal(settings: Settings) -> str:
    with pytest.raises(StackError) as caught:
        check_ports(settings)
    return str(caught.value)


def test_an_s3_endpoint_on_temporals_http_port_is_refused(unstarted: Stack) -> None:
    settings = with_s3(unstarted.settings, unstarted.settings.temporal.http_port)
    message = refusal(settings)
    assert "temporal.http_port (TEMPERED_TEMPORAL__HTTP_PORT)" in message, message
    assert "s3.endpoint (TEMPERED_S3__ENDPOINT)" in message, message


def test_an_s3_endpoint_on_a_seaweed_base_port_is_refused(unstarted: Stack) -> None:
    base = unstarted.settings.s3.embedded_base_port
    message = refusal(with_s3(unstarted.settings, base + 3))
    assert "s3.embedded_base_port + 3 (TEMPERED_S3__EMBEDDED_BASE_PORT)" in message, message
    assert "s3.endpoint (TEMPERED_S3__ENDPOINT)" in message, message


def test_temporal_ports_that_collide_are_refused(tmp_path: Path) -> None:
    temporal = TemporalSettings(address="127.0.0.1:17233", ui_port=17234, http_port=17234)
    message = refusal(Settings(home=tmp_path, temporal=temporal))
    assert "temporal.ui_port" in message and "temporal.http_port" in message, message


def test_an_external_temporal_and_s3_collide_with_nothing(tmp_path: Path) -> None:
    temporal = TemporalSettings(address="127.0.0.1:17243", http_port=17243, embedded=False)
    s3 = S3Settings(endpoint="https://s3.example.com:17243")
    check_ports(Settings(home=tmp_path, temporal=temporal, s3=s3))


def test_up_with_colliding_ports_starts_nothing(unstarted: Stack) -> None:
    http_port = unstarted.env["TEMPERED_TEMPORAL__HTTP_PORT"]
    unstarted.env["TEMPERED_S3__ENDPOINT"] = f"http://127.0.0.1:{http_port}"
    up = unstarted.tempered("up")
    assert up.returncode != 0, up.stdout + up.stderr
    assert "TEMPERED_S3__ENDPOINT" in up.stderr and "TEMPERED_TEMPORAL__HTTP_PORT" in up.stderr
    assert "Nothing started" in up.stderr, up.stderr
    assert stack.temporal_service(unstarted.settings).pid() is None
