"""The codec server's reads of S3 (infra/codec.py): only the objects references name exactly.

    reader = Reader(store)
    data, whole = reader.read(ref, limit)     # NotShown (its message is the UI's line) else

A client of its own, for display: short timeouts (a page waits on it, an activity does not),
anything but GetObject refused before it is sent, ranged reads of at most what is shown, and
each object checked against the reference's size and sha256 (a part against the object's
`sha256` metadata), so knowing a key is not enough to read it. Failures are one line with no
endpoint, bucket or credentials in it; the detail goes to the log. Not covered: what a request
may read in all (the resolver's budget, infra/codec.py).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from contracts.common import ObjectRef
from infra.storage import ObjectStore, s3_client
from infra.storage_errors import (
    ObjectNotFound,
    StorageError,
    TransientStorageError,
    translate_errors,
)

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 3.0
"""One S3 read of the codec (two attempts at most): a page waits on it, an activity does not."""
MISMATCH = "not shown: the stored object is not the referenced one (size or sha256)"
UNCHECKED = "not shown: the stored object has no sha256 to check a part of it against"
NOT_FOUND = "not shown: no such object"
REFUSED = "not shown: S3 refused the read (the codec server's log says why)"
UNAVAILABLE = "not shown: S3 did not answer"
log = logging.getLogger("tempered.codec")


class NotShown(Exception):
    """A reference whose content is not shown; the message is the line the UI gets."""


class S3Unavailable(NotShown):
    """S3 did not answer: no other reference of the request is tried."""


class Reader:
    """Reads the objects references name, and nothing else: a client of its own (short
    timeouts; anything but GetObject refused before it is sent), ranged reads of what is
    shown, each checked against the reference's size and sha256."""

    def __init__(self, store: ObjectStore):
        s3 = store.settings
        self.bucket, self.endpoint, self.access_key = store.bucket, store.endpoint, s3.access_key
        self.client = s3_client(
            s3,
            connect_timeout=min(s3.connect_timeout_s, CONNECT_TIMEOUT_S),
            read_timeout=READ_TIMEOUT_S,
            retries={"total_max_attempts": 2, "mode": "standard"},
            max_pool_connections=8,
        )
        self.client.meta.events.register("before-call.s3", _only_reads)

    def read(self, ref: ObjectRef, limit: int) -> tuple[bytes, bool]:
        """The first `min(ref.size, limit)` bytes of the object `ref` names, and whether they
        are all of it; `NotShown` unless the stored object is that one."""
        wanted = min(ref.size, limit)
        try:
            with translate_errors("get", ref.key, self.endpoint, self.bucket, self.access_key):
                return self._read(ref, wanted)
        except ObjectNotFound:
            raise NotShown(NOT_FOUND) from None
        except TransientStorageError as err:
            log.warning("reading %s: %s", ref.key, err)
            raise S3Unavailable(UNAVAILABLE) from None
        except StorageError as err:  # credentials, bucket, a key S3 will not take
            log.warning("reading %s: %s", ref.key, err)
            raise NotShown(REFUSED) from None

    def _read(self, ref: ObjectRef, wanted: int) -> tuple[bytes, bool]:
        args = {"Bucket": self.bucket, "Key": ref.key}
        if wanted:  # an empty object has no byte 0 to range over (InvalidRange)
            args["Range"] = f"bytes=0-{wanted - 1}"
        reply = self.client.get_object(**args)
        body = reply["Body"]
        try:
            stored = (reply.get("Metadata") or {}).get("sha256")
            if _total_size(reply) != ref.size or stored not in (None, ref.sha256):
                raise NotShown(MISMATCH)  # read nothing of it
            whole = wanted == ref.size
            if not whole and stored is None:
                raise NotShown(UNCHECKED)
            data = bytes(body.read(wanted))  # no more, even from a server that ignores Range
        finally:
            body.close()
        if whole and (len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256):
            raise NotShown(MISMATCH)
        return data, whole


def _only_reads(model: Any, **_: Any) -> None:
    if model.name != "GetObject":
        raise RuntimeError(f"the codec server does not {model.name}")


def _total_size(reply: dict[str, Any]) -> int | None:
    """The whole object's size: after the `/` of a ranged reply's Content-Range, else the
    reply's length (a whole object)."""
    content_range = reply.get("ContentRange")
    if not content_range:
        return int(reply.get("ContentLength", -1))
    total = content_range.rpartition("/")[2]
    return int(total) if total.isdigit() else None
