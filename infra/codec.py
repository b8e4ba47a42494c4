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
environment `service_env` writes), the dev server's UI pointed at it (`--ui-codec-endpoint`);
`tempered codec` runs one in the foreground.

It is for display only, and so:
- it never writes: its own S3 client sends GetObject (ranged, at most what it shows, or a
  JSON document whole up to `MAX_DOCUMENT_BYTES`) and refuses any other call, and `/encode`
  only takes away what `/decode` added;
- it caps what it reads and adds: `MAX_OBJECT_BYTES` sent of one object (`content_truncated`
  says how it was cut: a text's first bytes, a log's last, a document's long strings,
  infra/codec_documents.py; `shown` says so too, infra/codec_shown.py), `MAX_REFS` references
  (each read tried counts, found or not), `MAX_SECONDS` and `MAX_BYTES` per request (later
  references get no content); a reference's `size` is never trusted for how much to read.
  `MAX_BYTES` counts what is sent, not what is read (a 60 KB completion of token ids sends a
  few hundred bytes), so a response's payloads are at most its request's (re-encoded),
  `MAX_BYTES` and a line on each of its references, and 4/3 of that in base64;
- it answers only the UI's origin: a request (or CORS preflight) without an allowed `Origin`
  gets 403, and responses allow exactly that origin.
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
JSON and `/encode` are infra/codec_payloads.py's, the reads infra/codec_reader.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from contracts.common import ObjectRef
from infra.codec_documents import MAX_DOCUMENT_BYTES, as_sent, compact, fit
from infra.codec_payloads import as_ref, encode_payloads, rewritten
from infra.codec_reader import READ_THREADS, NotShown, Reader
from infra.codec_shown import Shown
from infra.settings import Settings, load_settings
from infra.storage import ObjectStore

MAX_OBJECT_BYTES = 64 * 1024
"""Bytes of one object sent at most (more is cut, `content_truncated` says how): of a text,
its first bytes (of a log, `.txt`, its last); of a JSON document, its JSON once shortened."""
MAX_BYTES = 1024 * 1024
"""Bytes one response adds at most, as sent: `content`, `shown` and the lines saying why not
inside them, as JSON (a text is in both; a control byte takes 6), before base64."""
MAX_REFS = 256
"""References resolved in one request at most."""
MAX_DEPTH = 2
"""A reference inside a resolved JSON document is resolved too; one inside that is not."""
MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (payloads are references, so this is generous)."""
MAX_SECONDS = 10.0
"""Time from a request's arrival (its wait for a thread included) in which it may read S3;
references after it get no content."""
OVER_LIMIT = "(not shown: over the codec server's limit for one request)"
log = logging.getLogger("tempered.codec")


@dataclass
class _Failures:
    """The references a request could not show, for one line of the log at its end."""

    first: dict[str, str] = field(default_factory=dict)  # the UI's line: its first detail
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, err: NotShown) -> None:
        self.first.setdefault(str(err), err.detail)
        self.counts[str(err)] += 1

    def log(self) -> None:
        if self.counts:
            kinds = "; ".join(f"{n} like {self.first[line]}" for line, n in self.counts.items())
            log.warning("%d references not shown: %s", self.counts.total(), kinds)


@dataclass
class _Budget:
    """What one request may still read and add, and what it could not show; made when the
    request arrives (its `MAX_SECONDS` count the wait for a thread too)."""

    refs: int = MAX_REFS
    bytes: int = MAX_BYTES
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    failures: _Failures = field(default_factory=_Failures)
    closed: bool = False  # a reference was over the limit: the later ones get no content


@dataclass
class Resolver:
    """Resolves references in decoded JSON for display, within one request's `_Budget`, and
    collects the texts they lead to (`shown`) for the top of the payload."""

    reader: Reader
    budget: _Budget = field(default_factory=_Budget)
    shown: Shown = field(default_factory=Shown)
    found: bool = False  # a reference: the payload is marked decoded (`shown`, `payload`)

    def resolve(self, node: Any, depth: int = 0) -> Any:
        if isinstance(node, list):
            return [self.resolve(item, depth) for item in node]
        if not isinstance(node, dict):
            return node
        resolved = {name: self.resolve(value, depth) for name, value in node.items()}
        ref = as_ref(node)
        if ref is not None and depth < MAX_DEPTH:
            resolved.update(self._content(ref, depth))
        return resolved

    def _content(self, ref: ObjectRef, depth: int) -> dict[str, Any]:
        budget = self.budget
        self.found = True
        limit = min(MAX_OBJECT_BYTES, budget.bytes // 2)  # a text is sent twice (`shown`)
        if budget.closed or budget.refs <= 0 or limit <= 0 or time.monotonic() > budget.deadline:
            return {"content": OVER_LIMIT}
        budget.refs -= 1  # a read tried counts, whatever it finds
        document = ref.key.endswith(".json") and ref.size <= MAX_DOCUMENT_BYTES
        try:  # a document whole (parsed, then cut to `limit`), any other object what is shown
            data, whole = self.reader.read(
                ref, MAX_DOCUMENT_BYTES if document else limit, from_end=_is_log(ref)
            )
        except NotShown as err:  # S3 not answering: the reader answers the next ones at once
            budget.failures.add(err)
            return {"content_error": str(err)}
        room, mark = budget.bytes, self.shown.mark()
        content = self._holding(ref, data, whole, limit, depth)
        added = self.shown.lines[mark[0] :]
        cost = len(as_sent(content)) + sum(len(as_sent(line)) + 1 for line in added)
        if cost > room:  # none of it (a cut JSON document or escape is no display), no more
            self.shown.undo(mark)
            budget.closed = True
            return {"content": OVER_LIMIT}
        budget.bytes = room - cost  # what is sent, the references inside it included
        return content

    def _holding(
        self, ref: ObjectRef, data: bytes, whole: bool, limit: int, depth: int
    ) -> dict[str, Any]:
        """What `ref` is given for `data`, what it holds (`whole`: all of it), at most `limit`
        bytes of it; its texts added to `shown`."""
        label, size, of = "/".join(ref.key.split("/")[-2:]), ref.size, ""
        if whole and ref.key.endswith(".json"):
            try:
                document = compact(json.loads(data))
                fitted = fit(document, limit)
            except (ValueError, RecursionError):
                pass  # not JSON after all (or too deep to read as JSON): show the text
            else:
                self.shown.glance(label, document)
                if fitted is not None:
                    return self._document(label, fitted, fitted is not document, depth)
                data = as_sent(document)  # too many items to fit: its first bytes, as text
                size, of = len(data), f" of its compacted JSON ({ref.size} stored)"
        from_end = not whole and _is_log(ref)  # the reader read its end
        data = data if from_end else data[:limit]  # a document read whole, cut
        text = data.decode(errors="replace")
        if len(data) == size:
            self.shown.text(label, text)
            return {"content": text}
        cut = f"{'last' if from_end else 'first'} {len(data)} of {size} bytes{of}"
        self.shown.text(label, text, cut, from_end)
        return {"content": text, "content_truncated": cut}

    def _document(self, label: str, document: Any, cut: bool, depth: int) -> dict[str, Any]:
        """A parsed document's content (`cut`: its long strings were), references resolved."""
        self.shown.texts(label, document)
        # what the references inside it may add, less what it sends: given back once resolved
        self.budget.bytes -= len(as_sent(document))
        content = {"content": self.resolve(document, depth + 1)}
        return {**content, "content_truncated": "long strings cut"} if cut else content


def _is_log(ref: ObjectRef) -> bool:
    """A log (stdout.txt, stderr.txt): shown by its end when cut, where its error is."""
    return ref.key.endswith(".txt")


def decode_payloads(
    reader: Reader, payloads: list[dict[str, Any]], budget: _Budget | None = None
) -> list[dict[str, Any]]:
    """Temporal's remote-codec `/decode`: JSON payloads with their references resolved, within
    `budget` (a new one if None), which the request's payloads share."""
    budget = budget if budget is not None else _Budget()  # `shown` is each payload's own
    decoded = [_decode_one(Resolver(reader, budget), payload) for payload in payloads]
    budget.failures.log()
    return decoded


def _decode_one(resolver: Resolver, payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with its references resolved; unchanged if it has none, is no JSON payload,
    or one this server cannot take (malformed, nested too deeply): it fails alone."""

    def decoded(value: Any) -> bytes | None:
        resolved = resolver.resolve(value)
        if not resolver.found:
            return None
        # what the references hold first (row previews, boxes show the top); `/encode` undoes it
        return as_sent({"shown": resolver.shown.lines, "payload": resolved})

    return rewritten(payload, decoded)


def create_app(store: ObjectStore, origins: Iterable[str]) -> web.Application:
    """The aiohttp app: `POST /decode`, `POST /encode` (its inverse), CORS for `origins` only."""
    allowed = frozenset(origin.rstrip("/") for origin in origins)
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
        budget = _Budget()  # the request's clock starts as it arrives, not once it has a thread
        payloads = await _payloads(request)
        loop = asyncio.get_running_loop()
        decoded = await loop.run_in_executor(reads, decode_payloads, reader, payloads, budget)
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


def ui_origins(ui_port: int) -> list[str]:
    """The embedded dev server's Web UI, as a browser names its origin."""
    return [f"http://127.0.0.1:{ui_port}", f"http://localhost:{ui_port}"]


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
