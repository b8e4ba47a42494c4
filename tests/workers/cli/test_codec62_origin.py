"""`tempered codec --origin`: each is an origin as a browser sends it (http or https, a host, no
path, query or fragment), kept lowercase; anything else is refused at parse time, exit 2, one
line. `notaurl`, a URL with a path, or `HTTPS://Host` were announced, and then every request
of that UI got 403 (its browser sends `https://host`, which matched no allowed origin)."""

from __future__ import annotations

import pytest

from workers.cli import build_parser


@pytest.mark.parametrize(
    "origin",
    [
        "notaurl",
        "127.0.0.1:8233",
        "ftp://host.example",
        "https://",
        "https://host.example/ui",
        "https://host.example?x=1",
        "https://host.example#top",
        "https://user@host.example",
        "https://host.example:99999",
    ],
)
def test_what_is_no_origin_is_refused_at_parse_time(
    origin: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["codec", "--origin", origin])
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"argument --origin: {origin!r} is not" in errors[0], errors


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("HTTPS://Temporal.Example.COM", "https://temporal.example.com"),
        ("https://temporal.example.com/", "https://temporal.example.com"),
        ("http://LOCALHOST:8233", "http://localhost:8233"),
        ("https://temporal.example.com:443", "https://temporal.example.com"),
        ("http://[::1]:8233", "http://[::1]:8233"),
    ],
)
def test_an_origin_is_kept_as_a_browser_sends_it(given: str, origin: str) -> None:
    assert build_parser().parse_args(["codec", "--origin", given]).origin == [origin]
