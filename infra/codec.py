"""The codec server of the Temporal Web UI: payloads shown with what their S3 references hold.

Tempered's payloads carry references (`{"key", "size", "sha256"}`), so the UI would show keys,
not code. The UI sends every payload it displays to its remote codec endpoint
(`POST /decode`, Temporal's remote-codec protocol); this server returns each JSON payload with
every reference it contains given a `content`: the object's text (a program, a log), or its
JSON document (a completion, an execution result, with the references inside those resolved
too, one level deep; lists of token ids shown as their length). A payload with references
becomes `{"shown": [lines], "payload": …}`: the texts they lead to first, one line per line
(each program, log, observation, and every multi-line field of a document, under a `── label
──` line; a document's status and reward in its label line), because the UI's event rows
preview a payload's first characters and its boxes show its first lines. `POST /encode`
undoes exactly that (the UI's "Start Workflow Like This One" sends it the decoded input): it
gives back the bytes the data converter wrote (`pydantic_core.to_json` of `payload` without
what its references were given; a float the UI's form rewrote, `30.0` as `30`, stays so). Any
other payload both leave as it came.

Started by `tempered up` (`infra.stack`) as `python -m infra.codec` (settings from the
environment `service_env` writes, its digest, `service_digest`, in the pidfile: one that runs
with others is restarted), the dev server's UI pointed at it (`--ui-codec-endpoint`);
`tempered codec` runs one in the foreground.

It is for display only, and so:
- it never writes: its own S3 client sends GetObject (ranged, at most what it shows, or a
  JSON document whole up to `MAX_DOCUMENT_BYTES`) and refuses any other call, and `/encode`
  only takes away what `/decode` added;
- it caps what it reads and adds: `MAX_OBJECT_BYTES` sent of one object (`content_truncated`
  says how it was cut: a text's first bytes, a log's last, a document's long strings,
  infra/codec_documents.py; `shown` says so too, infra/codec_shown.py), `MAX_REFS` references
  (each read tried counts, found or not), `MAX_SECONDS` (from when the request has its read
  thread) and `MAX_BYTES` per request (later references get a `content_error` naming the
  limit: infra/codec_resolver.py, the budget's home); a reference's `size` is never trusted
  for how much to read.
  `MAX_BYTES` counts what is sent, not what is read (a 60 KB completion of token ids sends a
  few hundred bytes), so a response's payloads are at most its request's (re-encoded),
  `MAX_BYTES` and a line on each of its references, and 4/3 of that in base64;
- it answers only the UI's origin: a request (or CORS preflight) without an allowed `Origin`
  gets 403, and responses allow exactly that origin (`ui_origins`: the embedded UI on
  127.0.0.1, localhost and where `tempered up` says it is; `ui_origin` keeps each as a
  browser sends it).
`Origin` keeps other web pages out, not other programs (any client can send the UI's), so a
reference is shown only if it names the stored object exactly: its size, and its sha256 (a
whole object's bytes are hashed, a part's object must carry that digest in its `sha256`
metadata, as every object Tempered writes does). Knowing a key is not enough to read it:
this server shows no more than the payloads that reference it already give away, and its
replies say nothing of an object a reference does not name exactly (missing, another size,
another digest: one line, `NO_MATCH`). Failures are a line with no endpoint, bucket or
credentials in it (`content_error`); the detail goes to the server's log, one line per
request, keys cut short (a forged request must not fill the disk). Once S3 does not answer,
no reference of any request is tried for `codec_reader.SILENT_S` (the UI sends many requests at
once, and each would wait out the timeouts again). Reads run on threads of their own
(`READ_THREADS`), so a hung S3 holds those, not the threads `/encode` runs on; the payloads'
JSON and `/encode` are infra/codec_payloads.py's, the reads infra/codec_reader.py's, the
resolving of references within a request's budget infra/codec_resolver.py's (its limits are
named here too: `MAX_BYTES`, `OVER_TIME`, …).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from infra.codec_payloads import encode_payloads
from infra.codec_reader import READ_THREADS, Reader
from infra.codec_resolver import MAX_BYTES as MAX_BYTES
from infra.codec_resolver import MAX_DEPTH as MAX_DEPTH
from infra.codec_resolver import MAX_OBJECT_BYTES as MAX_OBJECT_BYTES
from infra.codec_resolver import MAX_REFS as MAX_REFS
from infra.codec_resolver import MAX_SECONDS as MAX_SECONDS
from infra.codec_resolver import OVER_BYTES as OVER_BYTES
from infra.codec_resolver import OVER_REFS as OVER_REFS
from infra.codec_resolver import OVER_TIME as OVER_TIME
from infra.codec_resolver import decode_payloads
from infra.settings import Settings, load_settings
from infra.stack_services import temporal_ui
from infra.storage import ObjectStore

MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (payloads are references, so this is generous)."""
DEFAULT_PORTS = {"http": 80, "https": 443}
log = logging.getLogger("tempered.codec")


def create_app(store: ObjectStore, origins: Iterable[str]) -> web.Application:
    """The aiohttp app: `POST /decode`, `POST /encode` (its inverse), CORS for `origins` only."""
    allowed = frozenset(map(ui_origin, origins))
    reader = Reader(store)
    # threads of their own: a hung S3 holds these, not asyncio's default pool (`/encode`'s)
    reads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="codec-reads")

    @web.middleware
    async def only_the_ui(request: web.Request, handler: Any) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")
        if origin not in allowed:
            return web.json_response({"error": f"origin {origin!r} is not allowed"}, status=403)
        try:
            response = await handler(request)
        except web.HTTPException as error:  # a 400 without CORS is a CORS error to the browser
            _allow(error.headers, origin, request)
            raise
        _allow(response.headers, origin, request)
        return response

    async def decode(request: web.Request) -> web.Response:
        payloads = await _payloads(request)
        loop = asyncio.get_running_loop()  # its budget's clock starts once it has a read thread
        decoded = await loop.run_in_executor(reads, decode_payloads, reader, payloads)
        return web.json_response({"payloads": decoded})

    async def encode(request: web.Request) -> web.Response:
        payloads = await _payloads(request)
        return web.json_response({"payloads": await asyncio.to_thread(encode_payloads, payloads)})

    async def stop_reads(app: web.Application) -> None:
        reads.shutdown(wait=False, cancel_futures=True)

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204)  # the middleware adds the CORS headers

    app = web.Application(middlewares=[only_the_ui], client_max_size=MAX_REQUEST_BYTES)
    app.on_cleanup.append(stop_reads)
    for path, handler in (("/decode", decode), ("/encode", encode)):
        app.router.add_post(path, handler)
        app.router.add_route("OPTIONS", path, preflight)
    return app


def _allow(headers: Any, origin: str, request: web.Request) -> None:
    """CORS headers of a response (or error) to `origin`, an allowed one."""
    headers["Access-Control-Allow-Origin"] = origin
    headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
    headers["Access-Control-Allow-Headers"] = request.headers.get(
        "Access-Control-Request-Headers", "content-type, x-namespace"
    )
    headers["Access-Control-Max-Age"] = "600"
    headers["Vary"] = "Origin"


async def _payloads(request: web.Request) -> list[dict[str, Any]]:
    try:
        body = await request.json()
        payloads = body["payloads"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise web.HTTPBadRequest(text='expected {"payloads": [...]}') from None
    if not isinstance(payloads, list) or not all(isinstance(p, dict) for p in payloads):
        raise web.HTTPBadRequest(text='"payloads" must be a list of payload objects')
    return payloads


def ui_origins(settings: Settings) -> list[str]:
    """The embedded dev server's Web UI, as a browser names its origin: on 127.0.0.1 and
    localhost, and where `tempered up` says it is (`temporal_ui`: the Temporal host, which may
    be 0.0.0.0 or a LAN address the browser then names)."""
    port = settings.temporal.ui_port
    origins = [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]
    if (printed := temporal_ui(settings)) is not None:
        origins.append(ui_origin(printed))
    return list(dict.fromkeys(origins))


def ui_origin(text: str) -> str:
    """`text` as a browser sends it in `Origin`: scheme and host lowercase, no default port;
    ValueError, one line, unless it is an http(s) URL with a host and nothing after it (a `/`
    alone is taken)."""
    try:
        url = urlsplit(text.strip())
        port = url.port
    except ValueError as err:
        raise ValueError(f"{text!r} is not an origin ({err})") from None
    scheme, host = url.scheme.lower(), url.hostname
    if scheme not in DEFAULT_PORTS or not host:
        raise ValueError(f"{text!r} is not an origin: expected http:// or https:// and a host")
    if url.path not in ("", "/") or url.query or url.fragment or "?" in text or "#" in text:
        raise ValueError(f"{text!r} is not an origin: it has a path, query or fragment")
    if url.username is not None or url.password is not None:
        raise ValueError(f"{text!r} is not an origin: it has a user")
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
    return f"{scheme}://{host}" + ("" if port in (None, DEFAULT_PORTS[scheme]) else f":{port}")


async def serve(
    store: ObjectStore,
    host: str,
    port: int,
    origins: Iterable[str],
    listening: Callable[[], object] = lambda: None,
) -> None:
    """Serve until cancelled; `listening` is called once the server listens. The site's bind
    is the one check of the address: an OSError (in use, not this host's, no such host)
    before `listening`, never a probe of its own first."""
    runner = web.AppRunner(create_app(store, origins), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("codec server on http://%s:%d", host, port)
        listening()
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
        "TEMPERED_TEMPORAL__ADDRESS": temporal.address,  # the UI's host (`ui_origins`)
        "TEMPERED_TEMPORAL__UI_PORT": str(temporal.ui_port),
        "TEMPERED_TEMPORAL__CODEC_PORT": str(temporal.codec_port),
    }
    if settings.config is not None:  # whatever the environment does not say, the file says
        env["TEMPERED_CONFIG"] = str(settings.config)
    return {name: value for name, value in env.items() if value}


def service_digest(settings: Settings) -> str:
    """What tells the settings `service_env` gives the codec server from others, for its
    pidfile (`tempered up` restarts one that runs with others): a digest of that environment,
    its secret hashed first, so the pidfile never holds it."""
    env = service_env(settings)
    for name in ("TEMPERED_S3__SECRET_KEY",):
        if name in env:
            env[name] = hashlib.sha256(env[name].encode()).hexdigest()
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def main() -> None:
    """`python -m infra.codec`: serve the settings' store to their UI until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = load_settings()
    store = ObjectStore.from_settings(settings)
    origins = ui_origins(settings)
    asyncio.run(serve(store, "127.0.0.1", settings.temporal.codec_port, origins))


if __name__ == "__main__":
    main()
