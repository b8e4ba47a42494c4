"""Settings values refused when they load, each in one line naming the setting: an S3 endpoint
that is no http(s) URL (`up` started Temporal, then failed "bad S3 endpoint URL …: Invalid
endpoint"), a `config` key inside a settings file (the CLI read that file, its workers the one
the key named), an empty `home` in a file (it became the working directory, where
TEMPERED_HOME="" is refused); and `~` in TEMPERED_CONFIG, expanded as in TEMPERED_HOME.

Every test runs in an empty working directory with no `TEMPERED_*` variables set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import S3Settings, load_settings
from tests.fixtures.settings_env import refusal

pytestmark = pytest.mark.usefixtures("clean")  # tests/fixtures/settings_env.py


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:8333", "localhost", "ftp://127.0.0.1:8333", "http://", "http://h:x"]
)
def test_an_s3_endpoint_that_is_no_http_url_is_refused_naming_the_variable(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERED_S3__ENDPOINT", endpoint)
    message = refusal()
    assert "s3.endpoint" in message and "TEMPERED_S3__ENDPOINT" in message, message
    assert "http://" in message, message  # the fix


def test_an_empty_s3_endpoint_means_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_S3__ENDPOINT", "")
    assert load_settings().s3.endpoint is None


@pytest.mark.parametrize(
    "endpoint", ["http://127.0.0.1:8333", "https://s3.example.com", "http://[::1]:9000/"]
)
def test_http_and_https_endpoints_pass(endpoint: str) -> None:
    assert S3Settings(endpoint=endpoint).endpoint == endpoint


def test_a_config_key_in_a_settings_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other.toml").write_text("")
    (tmp_path / "tempered.toml").write_text('config = "other.toml"\n[sandbox]\nconcurrency = 3\n')
    message = refusal()
    assert "tempered.toml" in message and "config" in message, message
    assert "--config" in message and "TEMPERED_CONFIG" in message, message


def test_an_empty_home_in_a_settings_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "h.toml").write_text('home = ""\n')
    message = refusal(config=tmp_path / "h.toml")
    assert "h.toml" in message and "home" in message and "empty" in message, message


def test_an_empty_path_further_down_in_a_settings_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text('[sandbox.workspaces]\nroot = ""\n')
    message = refusal(config=tmp_path / "w.toml")
    assert "w.toml" in message and "sandbox.workspaces.root" in message, message


def test_a_tilde_in_tempered_config_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.toml").write_text("[sandbox]\nconcurrency = 3\n")
    monkeypatch.setenv("TEMPERED_CONFIG", "~/t.toml")
    settings = load_settings()
    assert settings.sandbox.concurrency == 3
    assert settings.config == tmp_path / "t.toml"
