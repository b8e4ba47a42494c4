"""Checks a store before Tempered relies on it: that it answers, and that it honours create-only
writes.

    wait_ready(store, timeout_s=60, running=lambda: service.pid() is not None)   # after a start
    check_create_only(store)            # PermanentStorageError if If-None-Match is ignored

`tempered up` (infra/stack.py) runs both against the embedded SeaweedFS, and the second against
an external S3; the test fixtures wait on their own server. Blocking, like `ObjectStore`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable

from infra.storage import (
    ObjectExists,
    ObjectStore,
    PermanentStorageError,
    StorageError,
    TransientStorageError,
)

PROBE_PREFIX = ".tempered-probe/"
"""Where `check_create_only` writes (and then deletes) its probe objects."""


def wait_ready(
    store: ObjectStore,
    timeout_s: float,
    probe_key: str = ".tempered-ready",
    running: Callable[[], bool] = lambda: True,
) -> None:
    """Poll a put + get of `probe_key` until it works: after a (re)start SeaweedFS answers S3
    requests before its volumes have re-registered and fails them with InternalError. Gives up
    at once when `running()` says the server has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            store.put_bytes(probe_key, b"ready")
            store.get_bytes(probe_key)
            return
        except TransientStorageError as exc:
            if not running():
                raise TransientStorageError(f"{exc} (the server has exited)") from exc
            if time.monotonic() >= deadline:
                raise TransientStorageError(
                    f"{exc} (still failing after {timeout_s:.0f}s)"
                ) from exc
            time.sleep(0.2)


def check_create_only(store: ObjectStore) -> None:
    """Refuse a store that ignores `If-None-Match: *` (create-only writes, and with them
    exactly-once trajectories, acks and policy versions, depend on it): write a fresh probe key
    twice with different content; the second write must be refused."""
    probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        store.put_bytes(probe, b"first", create_only=True)
        try:
            store.put_bytes(probe, b"second", create_only=True)
        except ObjectExists:
            return
        raise PermanentStorageError(
            f"S3 at {store.endpoint} ignores If-None-Match (a create-only write overwrote "
            f"{probe}); Tempered needs conditional writes for exactly-once results"
        )
    finally:
        with contextlib.suppress(StorageError):
            store.delete(probe)
