"""Checks a store before Tempered relies on it: that it answers, that it takes the credentials,
and that it honours create-only writes.

    wait_ready(store, timeout_s=60, running=lambda: service.pid() is not None)   # after a start
    check_access(store, wait_s=60)      # a worker's start: one line naming the settings to fix
    check_create_only(store)            # PermanentStorageError if If-None-Match is ignored

`tempered up` (infra/stack.py) runs the first and the last against the embedded SeaweedFS, and
the last against an external S3; a worker whose activities use S3 runs `check_access` at start
(workers/runtime.py); the test fixtures wait on their own server. Blocking, like `ObjectStore`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from botocore.exceptions import ClientError
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from infra.settings import S3Settings
from infra.storage import (
    ObjectExists,
    ObjectStore,
    PermanentStorageError,
    StorageError,
    TransientStorageError,
)

log = logging.getLogger("tempered.storage")
PROBE_PREFIX = ".tempered-probe/"
"""Where `check_create_only` writes (and then deletes) its probe objects."""
REFUSED_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"})
"""The S3 error codes (and any 403) of credentials the store refused."""
CREDENTIAL_SETTINGS = (
    "set TEMPERED_S3__ACCESS_KEY and TEMPERED_S3__SECRET_KEY to the store's (in the Helm chart: "
    "s3.accessKey and s3.secretKey, or both keys in the Secret that s3.existingSecret names)"
)
ENDPOINT_SETTING = "is the store up? check TEMPERED_S3__ENDPOINT (in the Helm chart: s3.endpoint)"


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


def check_access(store: ObjectStore, wait_s: float) -> None:
    """List the bucket once with the configured credentials, retrying for up to `wait_s` while
    the store does not answer (one still starting); a `StorageError` in one line otherwise.
    Refused credentials name the access key id in use (never the secret) and the settings that
    set them: a worker given none (the chart's `s3.existingSecret` without its keys) used the
    development defaults, reported ready, and then failed every S3 activity."""
    retrying = Retrying(
        stop=stop_after_delay(wait_s),
        wait=wait_exponential(multiplier=0.2, max=5.0),
        retry=retry_if_exception_type(TransientStorageError),
        before_sleep=before_sleep_log(log, logging.INFO),
        reraise=True,
    )
    try:
        retrying(store.check)
    except TransientStorageError as exc:
        raise TransientStorageError(
            f"{exc} (still failing after {wait_s:.0f} s); {ENDPOINT_SETTING}"
        ) from exc
    except PermanentStorageError as exc:
        if not _refused(exc):
            raise
        raise PermanentStorageError(
            f"{exc}{_default_key(store.settings)}; {CREDENTIAL_SETTINGS}"
        ) from exc


def _refused(exc: PermanentStorageError) -> bool:
    """Whether the store refused the credentials (an unknown key, a wrong secret, no access)."""
    cause = exc.__cause__
    if not isinstance(cause, ClientError):
        return False
    code = str(cause.response.get("Error", {}).get("Code", ""))
    status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in REFUSED_CODES or status == 403


def _default_key(s3: S3Settings) -> str:
    """Where the access key in use is the settings' default: that it is, and why."""
    if s3.access_key != S3Settings.model_fields["access_key"].default:
        return ""
    return f"; '{s3.access_key}' is the development default, used where no access key is set"


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
