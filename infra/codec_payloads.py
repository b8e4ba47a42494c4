"""The codec server's payloads (infra/codec.py): JSON payloads rewritten, and `/encode`.

    rewritten(payload, rewrite)   # a JSON payload whose value `rewrite` made into new data
    encode_payloads(payloads)     # `/encode`: what `/decode` made of payloads, back

What `/decode` and `/encode` share: a payload of Temporal's remote-codec protocol (`metadata`
and `data`, base64) is rewritten only where it is JSON (`json/plain`) and `rewrite` gives new
data; any other payload, or one either cannot take, stays as it came (it fails alone).
`/encode` gives back the bytes the data converter wrote (`pydantic_core.to_json` of `payload`
without what `/decode` added to its references, `ADDED`). Not here: reading S3 or resolving
references (infra/codec.py, infra/codec_reader.py); `/encode` never touches S3.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from pydantic_core import to_json

from contracts.common import ObjectRef

JSON_ENCODING = "json/plain"
ADDED = ("content", "content_error", "content_truncated")
"""What `/decode` adds to a reference, and `/encode` takes away."""


def as_ref(node: dict[str, Any]) -> ObjectRef | None:
    """`node` as a reference (`{"key", "size", "sha256"}`, valid), else None."""
    if not {"key", "size", "sha256"} <= node.keys():
        return None
    try:
        return ObjectRef.model_validate({k: node[k] for k in ("key", "size", "sha256")})
    except ValueError:
        return None


def rewritten(payload: dict[str, Any], rewrite: Callable[[Any], bytes | None]) -> dict[str, Any]:
    """A JSON payload whose value `rewrite` turned into new data; `payload` as it came where
    it is no JSON payload, `rewrite` gives None, or either cannot take it (it fails alone)."""
    try:
        metadata = payload.get("metadata") or {}
        if _encoding(metadata) != JSON_ENCODING:
            return payload  # binary/null/protobuf: shown as the UI shows it
        data = rewrite(json.loads(base64.b64decode(payload.get("data", ""))))
    except (ValueError, TypeError, AttributeError, RecursionError):
        return payload
    if data is None:
        return payload
    return {"metadata": metadata, "data": base64.b64encode(data).decode()}


def _encoding(metadata: dict[str, Any]) -> str:
    return base64.b64decode(metadata.get("encoding", "")).decode(errors="replace")


def encode_payloads(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Temporal's remote-codec `/encode`: what `/decode` made of a payload, back to what the
    data converter wrote (`pydantic_core.to_json`); any other payload unchanged."""
    return [_encode_one(payload) for payload in payloads]


def _encode_one(payload: dict[str, Any]) -> dict[str, Any]:
    def encoded(value: Any) -> bytes | None:
        if not _is_decoded(value) or (original := _undecoded(value["payload"])) == value["payload"]:
            return None  # not what `/decode` gives: it adds to every reference of `payload`
        return to_json(original)

    return rewritten(payload, encoded)


def _is_decoded(value: Any) -> bool:
    """Whether `value` has the shape `/decode` gives a payload with references."""
    if not isinstance(value, dict) or value.keys() != {"shown", "payload"}:
        return False
    return isinstance(value["shown"], list) and all(isinstance(s, str) for s in value["shown"])


def _undecoded(node: Any) -> Any:
    """`node` without what `/decode` added to its references (`ADDED`)."""
    if isinstance(node, list):
        return [_undecoded(item) for item in node]
    if not isinstance(node, dict):
        return node
    added = ADDED if as_ref(node) is not None else ()
    return {name: _undecoded(value) for name, value in node.items() if name not in added}
