"""Throttling is transient: an S3 server that answers 429 (`TooManyRequests`, as Ceph RGW and
MinIO do; AWS says `SlowDown`) asks for a retry later. Before, it fell through to
PermanentStorageError ("fix the configuration"): an activity failed for good on a busy store.
Pure classification of a ClientError (SeaweedFS sends no 429 to provoke)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from infra.storage import TransientStorageError
from infra.storage_errors import classify_client_error


@pytest.mark.parametrize(
    ("code", "status"),
    [("TooManyRequests", 429), ("429", 429), ("RequestLimitExceeded", 429), ("", 429)],
)
def test_too_many_requests_is_transient(code: str, status: int) -> None:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    error = classify_client_error(
        ClientError(response, "GetObject"), "get", "k", "http://s3", "b", "ak"
    )
    assert type(error) is TransientStorageError, error
