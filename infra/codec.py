"""The codec server of the Temporal Web UI: payloads shown with what their S3 references hold.

Tempered's payloads carry references (`{"key", "size", "sha256"}`), so the UI would show keys,
not code. The UI sends every payload it displays to its remote codec endpoint
(`POST /decode`, Temporal's remote-codec protocol); this server returns each JSON payload with
every reference it contains given a `content`: the object's text (a program, a log), or its
JSON document (a completion, an execution result, with the references inside those resolved
too, one level deep; lists of token ids shown as their length). A payload whose references
lead to text becomes `{"shown": [lines], "payload": …}`: those texts first, one line per line
(each program, log, observation, and every multi-line field of a document, under a `── label
──` line; a document's status and reward in its label line), because the UI's event rows
preview a payload's first characters and its boxes show its first lines. Started by `tempered up` (`infra.stack`) and wired into the dev server's
UI (`--ui-codec-endpoint`); `tempered codec` runs it in the foreground.

Run in the background by `tempered up` as `python -m infra.codec` (settings from the
environment `service_env` writes).

It is for display only, and so:
- it never writes: its own S3 client sends GetObject (ranged, at most what it shows) and
  refuses any other call, and `/encode` hands payloads back unchanged;
- it caps what it reads and returns: `MAX_OBJECT_BYTES` of one object (`content_truncated`
  says so), `MAX_BYTES`, `MAX_REFS` references (each read tried counts, found or not) and
  `MAX_SECONDS` per request (later references get no content); a reference's `size` is never
  trusted for how much to read;
- it answers only the UI's origin: a request (or CORS preflight) without an allowed `Origin`
  gets 403, and responses allow exactly that origin.
`Origin` keeps other web pages out, not other programs (any client can send the UI's), so a
reference is shown only if it names the stored object exactly: its size, and its sha256 (a
whole object's bytes are hashed, a part's object must carry that digest in its `sha256`
metadata, as every object Tempered writes does). Knowing a key is not enough to read it:
this server shows no more than the payloads that reference it already give away. Failures
are a line with no endpoint, bucket or credentials in it (`content_error`; the detail goes
to the server's log); once S3 does not answer, the rest of the request is not tried.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from contracts.common import ObjectRef
from infra.codec_reader import UNAVAILABLE, NotShown, Reader, S3Unavailable
from infra.settings import Settings, load_settings
from infra.storage import ObjectStore

MAX_OBJECT_BYTES = 64 * 1024
"""Bytes of one object shown at most (more is cut, `content_truncated: true`)."""
MAX_SHOWN_LINES = 200
"""Lines of `shown` (the texts a payload's references lead to) per payload at most."""
AT_A_GLANCE = ("status", "reward", "solved", "tests_passed", "tests_total", "end")
"""Fields of a resolved document that `shown` states in one line (a result, a trajectory)."""
MAX_NUMBERS = 16
"""A resolved document's list of more numbers than this (token ids) shows as its length."""
MAX_BYTES = 1024 * 1024
"""Bytes of object content in one response at most."""
MAX_REFS = 256
"""References resolved in one request at most."""
MAX_DEPTH = 2
"""A reference inside a resolved JSON document is resolved too; one inside that is not."""
MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (payloads are references, so this is generous)."""
MAX_SECONDS = 10.0
"""Time one request may spend reading S3; references after it get no content."""
JSON_ENCODING = "json/plain"
OVER_LIMIT = "(not shown: over the codec server's limit for one request)"
log = logging.getLogger("tempered.codec")


@dataclass
class _Budget:
    """What one request may still read."""

    refs: int = MAX_REFS
    bytes: int = MAX_BYTES
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    unavailable: bool = False  # S3 did not answer: nothing more is tried


@dataclass
class Resolver:
    """Resolves references in decoded JSON for display, within one request's `_Budget`, and
    collects the texts they lead to (`shown`) for the top of the payload."""

    reader: Reader
    budget: _Budget = field(default_factory=_Budget)
    shown: list[str] = field(default_factory=list)
    _texts: list[str] = field(default_factory=list)  # what `shown` holds, whole

    def resolve(self, node: Any, depth: int = 0) -> Any:
        if isinstance(node, list):
            if depth > 0 and len(node) > MAX_NUMBERS and all(_is_number(x) for x in node):
                return f"({len(node)} numbers)"  # token ids, log-probs: not for reading
            return [self.resolve(item, depth) for item in node]
        if not isinstance(node, dict):
            return node
        resolved = {name: self.resolve(value, depth) for name, value in node.items()}
        ref = _as_ref(node)
        if ref is not None and depth < MAX_DEPTH:
            resolved.update(self._content(ref, depth))
        return resolved

    def _content(self, ref: ObjectRef, depth: int) -> dict[str, Any]:
        budget = self.budget
        if budget.unavailable:
            return {"content_error": UNAVAILABLE}
        if budget.refs <= 0 or budget.bytes <= 0 or time.monotonic() > budget.deadline:
            return {"content": OVER_LIMIT}
        budget.refs -= 1  # a read tried counts, whatever it finds
        try:
            data, whole = self.reader.read(ref, min(MAX_OBJECT_BYTES, budget.bytes))
        except S3Unavailable as err:
            budget.unavailable = True
            return {"content_error": str(err)}
        except NotShown as err:
            return {"content_error": str(err)}
        budget.bytes -= len(data)
        label = "/".join(ref.key.split("/")[-2:])
        if whole and ref.key.endswith(".json"):
            try:
                document = json.loads(data)
            except (ValueError, RecursionError):
                pass  # not JSON after all (or too deep to read as JSON): show the text
            else:
                self._show_glance(label, document)
                self._show_texts(label, document)
                return {"content": self.resolve(document, depth + 1)}
        text = data.decode(errors="replace")
        self._show(label, text)
        return {"content": text, "content_truncated": True} if not whole else {"content": text}

    def _show_glance(self, label: str, document: Any) -> None:
        """One line of what a document says at a glance (its `AT_A_GLANCE` fields)."""
        if not isinstance(document, dict) or len(self.shown) >= MAX_SHOWN_LINES:
            return
        glance = [
            f"{name} {json.dumps(document[name])}" for name in AT_A_GLANCE if name in document
        ]
        if glance:
            self.shown.append(f"── {label}: {', '.join(glance)} ──")

    def _show_texts(self, label: str, node: Any, path: str = "") -> None:
        """The multi-line strings of a JSON document (a log, a program), labelled by field."""
        if isinstance(node, dict):
            for name, value in node.items():
                self._show_texts(label, value, f"{path}.{name}" if path else name)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                self._show_texts(label, value, f"{path}[{index}]")
        elif isinstance(node, str) and "\n" in node.strip():
            self._show(f"{label} {path}", node)

    def _show(self, label: str, text: str) -> None:
        room = MAX_SHOWN_LINES - len(self.shown)
        text = text.strip("\n")
        if room <= 1 or not text.strip() or any(text in seen for seen in self._texts):
            return  # nothing, or what an earlier text holds (a program inside its completion)
        self._texts.append(text)
        lines = text.rstrip().splitlines()
        self.shown.append(f"── {label} ──")
        self.shown += lines[: room - 1]
        if len(lines) > room - 1:
            self.shown.append("…")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_ref(node: dict[str, Any]) -> ObjectRef | None:
    if not {"key", "size", "sha256"} <= node.keys():
        return None
    try:
        return ObjectRef.model_validate({k: node[k] for k in ("key", "size", "sha256")})
    except ValueError:
        return None


def decode_payloads(reader: Reader, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Temporal's remote-codec `/decode`: JSON payloads with their references resolved."""
    budget = _Budget()  # shared by the request's payloads; `shown` is each payload's own
    return [_decode_one(Resolver(reader, budget), payload) for payload in payloads]


def _decode_one(resolver: Resolver, payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with its references resolved; unchanged if it is no JSON payload, or one
    this server cannot take (malformed, nested too deeply): it fails alone, not the request."""
    try:
        metadata = payload.get("metadata") or {}
        encoding = base64.b64decode(metadata.get("encoding", "")).decode(errors="replace")
        if encoding != JSON_ENCODING:
            return payload  # binary/null/protobuf: shown as the UI shows it
        resolved = resolver.resolve(json.loads(base64.b64decode(payload.get("data", ""))))
        if resolver.shown:  # what the references hold, first: row previews, boxes show the top
            resolved = {"shown": resolver.shown, "payload": resolved}
        data = json.dumps(resolved, ensure_ascii=False).encode()
    except (ValueError, TypeError, AttributeError, RecursionError):
        return payload
    return {"metadata": metadata, "data": base64.b64encode(data).decode()}


def create_app(store: ObjectStore, origins: Iterable[str]) -> web.Application:
    """The aiohttp app: `POST /decode`, `POST /encode` (identity), CORS for `origins` only."""
    allowed = frozenset(origin.rstrip("/") for origin in origins)
    reader = Reader(store)

    @web.middleware
    async def only_the_ui(request: web.Request, handler: Any) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")
        if origin not in allowed:
            return web.json_response({"error": f"origin {origin!r} is not allowed"}, status=403)
        response = await handler(request)
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
        response.headers["Access-Control-Allow-Headers"] = request.headers.get(
            "Access-Control-Request-Headers", "content-type, x-namespace"
        )
        response.headers["Access-Control-Max-Age"] = "600"
        response.headers["Vary"] = "Origin"
        return response

    async def decode(request: web.Request) -> web.Response:
        payloads = await _payloads(request)
        decoded = await asyncio.to_thread(decode_payloads, reader, payloads)
        return web.json_response({"payloads": decoded})

    async def encode(request: web.Request) -> web.Response:
        return web.json_response({"payloads": await _payloads(request)})

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204)  # the middleware adds the CORS headers

    app = web.Application(middlewares=[only_the_ui], client_max_size=MAX_REQUEST_BYTES)
    for path, handler in (("/decode", decode), ("/encode", encode)):
        app.router.add_post(path, handler)
        app.router.add_route("OPTIONS", path, preflight)
    return app


async def _payloads(request: web.Request) -> list[dict[str, Any]]:
    try:
        body = await request.json()
        payloads = body["payloads"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise web.HTTPBadRequest(text='expected {"payloads": [...]}') from None
    if not isinstance(payloads, list) or not all(isinstance(p, dict) for p in payloads):
        raise web.HTTPBadRequest(text='"payloads" must be a list of payload objects')
    return payloads


def ui_origins(ui_port: int) -> list[str]:
    """The embedded dev server's Web UI, as a browser names its origin."""
    return [f"http://127.0.0.1:{ui_port}", f"http://localhost:{ui_port}"]


async def serve(store: ObjectStore, host: str, port: int, origins: Iterable[str]) -> None:
    """Serve until cancelled."""
    runner = web.AppRunner(create_app(store, origins), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("codec server on http://%s:%d", host, port)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def endpoint(settings: Settings) -> str:
    """Where the dev server's Web UI finds the codec server."""
    return f"http://127.0.0.1:{settings.temporal.codec_port}"


def service_env(settings: Settings) -> dict[str, str]:
    """The environment of `python -m infra.codec` serving `settings`' store and UI."""
    s3, temporal = settings.s3, settings.temporal
    env = {
        "TEMPERED_HOME": str(settings.home),
        "TEMPERED_S3__ENDPOINT": s3.endpoint or "",
        "TEMPERED_S3__REGION": s3.region,
        "TEMPERED_S3__BUCKET": s3.bucket,
        "TEMPERED_S3__ACCESS_KEY": s3.access_key,
        "TEMPERED_S3__SECRET_KEY": s3.secret_key.get_secret_value(),
        "TEMPERED_TEMPORAL__UI_PORT": str(temporal.ui_port),
        "TEMPERED_TEMPORAL__CODEC_PORT": str(temporal.codec_port),
    }
    if settings.config is not None:  # whatever the environment does not say, the file says
        env["TEMPERED_CONFIG"] = str(settings.config)
    return {name: value for name, value in env.items() if value}


def main() -> None:
    """`python -m infra.codec`: serve the settings' store to their UI until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = load_settings()
    store = ObjectStore.from_settings(settings)
    origins = ui_origins(settings.temporal.ui_port)
    asyncio.run(serve(store, "127.0.0.1", settings.temporal.codec_port, origins))


if __name__ == "__main__":
    main()
