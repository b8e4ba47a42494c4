"""Large objects in parts: the multipart upload behind `ObjectStore.upload_file`, and the
transfer settings of the store's downloads.

    config = transfer_config()          # boto3's managed downloads: parallel ranged GETs
    upload_in_parts(client, bucket, path, ref, create_only, errors)
    abort_uploads(client, bucket, "runs/r1/", errors)   # what writers killed mid-upload left

`ObjectStore.upload_file` sends a file above MULTIPART_THRESHOLD through `upload_in_parts`:
PART_SIZE parts, PART_WORKERS at a time, each read from disk by its own worker (never the whole
file in memory), the object's sha256 (`ref`, hashed beforehand) in its `sha256` metadata as for
a single PUT. With `create_only` the completing request carries `If-None-Match: *`; any
failure, a refused completion included, aborts the upload so no parts are left behind, and the
typed error (`errors`, the store's botocore translation) propagates. A writer killed mid-upload
aborts nothing: its parts stay stored, counted by S3 but listed by no list of keys, until
`abort_uploads` (`tempered runs rm`, for the run's prefix) aborts them.

Not covered: choosing between one PUT and parts, hashing the file, and what a refused
create-only write means (an identical object is a success): `infra/storage.py`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from contracts.common import ObjectRef

MULTIPART_THRESHOLD = 16 * 2**20
"""Files above this go up in parts of PART_SIZE bytes (and down in parallel ranged GETs)."""
PART_SIZE = 8 * 2**20
PART_WORKERS = 4

Errors = Callable[[str, str], contextlib.AbstractContextManager[None]]
"""`errors(op, key)`: a context that turns botocore's exceptions into the typed storage errors."""


def transfer_config() -> TransferConfig:
    """boto3's transfer settings for the store's managed downloads (and uploads)."""
    return TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD,
        multipart_chunksize=PART_SIZE,
        max_concurrency=PART_WORKERS,
    )


def upload_in_parts(
    client: Any, bucket: str, path: Path, ref: ObjectRef, create_only: bool, errors: Errors
) -> None:
    """Upload `path` as `ref` (its key, size and sha256) in parallel parts."""
    with errors("multipart upload", ref.key):
        upload_id = client.create_multipart_upload(
            Bucket=bucket,
            Key=ref.key,
            Metadata={"sha256": ref.sha256},
            ContentType="application/octet-stream",
        )["UploadId"]
    try:
        offsets = range(0, ref.size, PART_SIZE)
        with ThreadPoolExecutor(PART_WORKERS) as pool:
            part = partial(_upload_part, client, bucket, path, ref.key, upload_id, errors)
            etags = list(pool.map(part, offsets))
        parts = [{"PartNumber": i + 1, "ETag": etag} for i, etag in enumerate(etags)]
        args: dict[str, Any] = {
            "Bucket": bucket,
            "Key": ref.key,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if create_only:
            args["IfNoneMatch"] = "*"
        with errors("complete multipart upload", ref.key):
            client.complete_multipart_upload(**args)
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(Bucket=bucket, Key=ref.key, UploadId=upload_id)
        raise


def abort_uploads(client: Any, bucket: str, prefix: str, errors: Errors) -> int:
    """Abort every incomplete multipart upload under `prefix`; how many there were."""
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    with errors("list multipart uploads", prefix):
        uploads = [
            (upload["Key"], upload["UploadId"])
            for page in pages
            for upload in page.get("Uploads", [])
            if upload["Key"].startswith(prefix)  # a server that ignored Prefix lists them all
        ]
    for key, upload_id in uploads:
        with errors("abort multipart upload", key):
            try:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                    raise  # NoSuchUpload: completed or aborted meanwhile, gone either way
    return len(uploads)


def _upload_part(
    client: Any, bucket: str, path: Path, key: str, upload_id: str, errors: Errors, offset: int
) -> str:
    """Upload the part of `path` that starts at `offset`; its ETag."""
    with path.open("rb") as fh:
        fh.seek(offset)
        chunk = fh.read(PART_SIZE)
    with errors("upload part", key):
        out = client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=offset // PART_SIZE + 1,
            Body=chunk,
        )
    return str(out["ETag"])
