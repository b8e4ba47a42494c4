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
- it never writes: it reads objects (a ranged GET for a large one) and nothing else, and
  `/encode` hands payloads back unchanged;
- it caps what it returns: `MAX_OBJECT_BYTES` of one object (`content_truncated` says so),
  `MAX_BYTES` and `MAX_REFS` per request (later references get no content);
- it answers only the UI's origin: a request (or CORS preflight) without an allowed `Origin`
  gets 403, and responses allow exactly that origin.
A whole object is checked against its digest (`content_error` when it does not match).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from contracts.common import ObjectRef
from infra.settings import Settings, load_settings
from infra.storage import ObjectStore
from infra.storage_errors import DigestMismatch, StorageError

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
JSON_ENCODING = "json/plain"
OVER_LIMIT = "(not shown: over the codec server's limit for one request)"
log = logging.getLogger("tempered.codec")


@dataclass
class _Budget:
    """What one request may still read."""

    refs: int = MAX_REFS
    bytes: int = MAX_BYTES


@dataclass
class Resolver:
    """Resolves references in decoded JSON for display, within one request's `_Budget`, and
    collects the texts they lead to (`shown`) for the top of the payload."""

    store: ObjectStore
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
        if self.budget.refs <= 0 or self.budget.bytes <= 0:
            return {"content": OVER_LIMIT}
        limit = min(MAX_OBJECT_BYTES, self.budget.bytes)
        whole = ref.size <= limit
        try:
            data = self.store.get_verified(ref) if whole else self.store.get_first(ref.key, limit)
        except DigestMismatch:
            return {"content_error": "the stored object does not match its sha256"}
        except StorageError as err:
            return {"content_error": str(err)}
        self.budget.refs -= 1
        self.budget.bytes -= len(data)
        label = "/".join(ref.key.split("/")[-2:])
        if whole and ref.key.endswith(".json"):
            try:
                document = json.loads(data)
            except ValueError:
                pass  # not JSON after all: show the text
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


def decode_payloads(store: ObjectStore, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Temporal's remote-codec `/decode`: JSON payloads with their references resolved."""
    budget = _Budget()  # shared by the request's payloads; `shown` is each payload's own
    return [_decode_one(Resolver(store, budget), payload) for payload in payloads]


def _decode_one(resolver: Resolver, payload: dict[str, Any]) -> dict[str, Any]:
    metadata = payload.get("metadata") or {}
    encoding = base64.b64decode(metadata.get("encoding", "")).decode(errors="replace")
    if encoding != JSON_ENCODING:
        return payload  # binary/null/protobuf: shown as the UI shows it
    try:
        value = json.loads(base64.b64decode(payload.get("data", "")))
    except ValueError:
        return payload
    resolved = resolver.resolve(value)
    if resolver.shown:  # what the references hold, first: row previews and boxes show the top
        resolved = {"shown": resolver.shown, "payload": resolved}
    data = json.dumps(resolved, ensure_ascii=False).encode()
    return {"metadata": metadata, "data": base64.b64encode(data).decode()}


def create_app(store: ObjectStore, origins: Iterable[str]) -> web.Application:
    """The aiohttp app: `POST /decode`, `POST /encode` (identity), CORS for `origins` only."""
    allowed = frozenset(origin.rstrip("/") for origin in origins)

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
        decoded = await asyncio.to_thread(decode_payloads, store, payloads)
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
    except (ValueError, KeyError, TypeError):
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
