"""The object store every part of Tempered uses: a small synchronous layer over boto3.

    store = ObjectStore.from_settings(load_settings())
    store.check()                                   # one clear line if S3 is down/misconfigured
    ref = store.put_json("runs/r/run.json", spec, create_only=True)
    spec = store.get_model("runs/r/run.json", TrainingRunInput)

Blocking: activities call it through `asyncio.to_thread`. Every object carries its sha256 in the
`sha256` metadata entry, so an `ObjectRef` is known without reading the body. `create_only`
writes use `If-None-Match: *`; rewriting identical content is a success (an idempotent retry),
different content raises `ObjectExists`. A create-only PUT also stores a random id of its call in
the `writer` metadata entry (`WRITER`): when the server stored it but its response was lost,
botocore sends it again and gets 412, and the id tells `put_once` that the object is its own
(created by this call, not found already there). botocore errors surface as the typed errors below:
`TransientStorageError` (retry later), `PermanentStorageError` (fix the configuration),
`ObjectNotFound`, `ObjectExists`, `DigestMismatch` (`get_verified`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from pydantic import BaseModel

from contracts.common import ObjectRef
from infra.settings import S3Settings, Settings
from infra.storage_errors import (
    BUCKET_EXISTS_CODES,
    DigestMismatch,
    ObjectExists,
    ObjectNotFound,
    PermanentStorageError,
    StorageError,
    TransientStorageError,
    translate_errors,
)
from infra.storage_multipart import (
    MULTIPART_THRESHOLD,
    abort_uploads,
    transfer_config,
    upload_in_parts,
)

__all__ = [
    "DigestMismatch",
    "ObjectExists",
    "ObjectNotFound",
    "ObjectStore",
    "PermanentStorageError",
    "StorageError",
    "TransientStorageError",
]

M = TypeVar("M", bound=BaseModel)

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
OCTETS = "application/octet-stream"
_READ_CHUNK = 2**20
SHA256 = "sha256"
"""The metadata entry holding an object's sha256."""
WRITER = "writer"
"""The metadata entry where `put_once` leaves the random id of the call that created it."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ref_of(key: str, data: bytes) -> ObjectRef:
    """The ref of `data` stored at `key`."""
    return ObjectRef(key=key, size=len(data), sha256=sha256_bytes(data))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def s3_client(s3: S3Settings, **config: Any) -> Any:
    """A boto3 S3 client of `s3`'s endpoint and credentials (path-style, SigV4), with `config`'s
    timeouts, retries and pool: the store's, and the codec server's own (infra/codec_reader.py)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name=s3.region,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key.get_secret_value(),
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4", **config),
    )


class ObjectStore:
    """One bucket of one S3 endpoint. Thread-safe (one boto3 client, shared)."""

    def __init__(
        self,
        s3: S3Settings,
        bucket: str | None = None,
        *,
        page_size: int = 1000,
        read_timeout_s: float = 60.0,
        retries: int | None = None,
    ):
        """`retries`: botocore's retries of a failed request, `s3.max_attempts` by default."""
        self.settings = s3
        self.bucket = bucket or s3.bucket
        self.endpoint = s3.endpoint or f"https://s3.{s3.region}.amazonaws.com"
        self.page_size = page_size
        try:
            self._client = s3_client(
                s3,
                connect_timeout=s3.connect_timeout_s,
                read_timeout=read_timeout_s,
                retries={
                    "max_attempts": s3.max_attempts if retries is None else retries,
                    "mode": "standard",
                },
                max_pool_connections=32,
            )
        except ValueError as exc:
            raise PermanentStorageError(f"bad S3 endpoint URL {s3.endpoint!r}: {exc}") from None
        self._transfer = transfer_config()

    @classmethod
    def from_settings(cls, settings: Settings) -> ObjectStore:
        return cls(settings.s3)

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists."""
        with self._errors("create bucket"):
            try:
                self._client.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in BUCKET_EXISTS_CODES:
                    raise

    def check(self) -> None:
        """Raise a typed error with one human line unless the bucket is listable."""
        with self._errors("list"):
            self._client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)

    def put_bytes(
        self, key: str, data: bytes, *, create_only: bool = False, content_type: str = OCTETS
    ) -> ObjectRef:
        if create_only:
            return self.put_once(key, data, content_type=content_type)[0]
        return self._put(ref_of(key, data), data, content_type)

    def put_once(
        self, key: str, data: bytes, *, content_type: str = OCTETS
    ) -> tuple[ObjectRef, bool]:
        """Create-only write: (ref, True) if this call created the object, (the stored ref,
        False) if `key` already holds these bytes (a retry); `ObjectExists` if other bytes.
        A 412 on botocore's resend of this call's own PUT (stored, its response lost) is
        told by the object's `WRITER` id: (ref, True)."""
        ref = ref_of(key, data)
        writer = uuid.uuid4().hex
        try:
            return self._put(ref, data, content_type, {"IfNoneMatch": "*"}, {WRITER: writer}), True
        except ObjectExists:
            meta = self._head_meta(key)  # one HEAD: the stored ref and who wrote it
            existing = None if meta is None else self._ref_of(key, meta)
            ref = self._existing_or_raise(ref, existing)
            return ref, meta is not None and meta.get("Metadata", {}).get(WRITER) == writer

    def _put(
        self,
        ref: ObjectRef,
        data: bytes,
        content_type: str,
        condition: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> ObjectRef:
        meta = {"ContentType": content_type, "Metadata": {SHA256: ref.sha256, **(extra or {})}}
        with self._errors("put", ref.key):
            self._client.put_object(
                Bucket=self.bucket, Key=ref.key, Body=data, **meta, **(condition or {})
            )
        return ref

    def put_if_unchanged(self, key: str, data: bytes, etag: str | None) -> bool:
        """Compare-and-swap: write `data` only if the object still has `etag` (`If-Match`), or
        with None only if there is none (`If-None-Match`); False if another writer came first."""
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            self._put(ref_of(key, data), data, JSON, condition)
        except (ObjectExists, ObjectNotFound):  # 412, or the object went away since the read
            return False
        return True

    def put_text(self, key: str, text: str, *, create_only: bool = False) -> ObjectRef:
        return self.put_bytes(key, text.encode(), create_only=create_only, content_type=TEXT)

    def put_json(
        self, key: str, obj: BaseModel | dict[str, Any] | list[Any], *, create_only: bool = False
    ) -> ObjectRef:
        """Deterministic JSON: a model's field order, or sorted keys for dicts and lists."""
        if isinstance(obj, BaseModel):
            data = obj.model_dump_json().encode()
        else:
            data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        return self.put_bytes(key, data, create_only=create_only, content_type=JSON)

    def upload_file(
        self, path: Path | str, key: str, *, create_only: bool = False, sha256: str | None = None
    ) -> ObjectRef:
        """Upload one file; above MULTIPART_THRESHOLD in parallel parts (`storage_multipart`).
        `sha256`: the file's digest, already computed by the caller: a file sent in parts is not
        read a second time to hash it (one sent whole is hashed from the bytes it sends)."""
        path = Path(path)
        size = path.stat().st_size
        if size <= MULTIPART_THRESHOLD:
            return self.put_bytes(key, path.read_bytes(), create_only=create_only)
        ref = ObjectRef(key=key, size=size, sha256=sha256 or sha256_file(path))
        if create_only and (existing := self.head(key)) is not None:
            return self._existing_or_raise(ref, existing)
        try:
            upload_in_parts(self._client, self.bucket, path, ref, create_only, self._errors)
        except ObjectExists:
            return self._existing_or_raise(ref)
        return ref

    def upload_dir(
        self, local_dir: Path | str, prefix: str, *, create_only: bool = False
    ) -> list[ObjectRef]:
        """Upload every file under `local_dir` to `prefix/<relative path>` (sorted order)."""
        root = Path(local_dir)
        base = prefix.rstrip("/") + "/"
        files = sorted(p for p in root.rglob("*") if p.is_file())
        return [
            self.upload_file(p, base + p.relative_to(root).as_posix(), create_only=create_only)
            for p in files
        ]

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix`; how many."""
        return self.delete_keys(list(self.list_keys(prefix)))

    def abort_uploads(self, prefix: str) -> int:
        """Abort the incomplete multipart uploads under `prefix`; how many (`storage_multipart`)."""
        return abort_uploads(self._client, self.bucket, prefix, self._errors)

    def delete_keys(self, doomed: list[str]) -> int:
        """Delete `doomed` (S3 DeleteObjects, 1,000 a request); how many."""
        for start in range(0, len(doomed), 1000):
            objects = [{"Key": key} for key in doomed[start : start + 1000]]
            with self._errors("delete", objects[0]["Key"]):
                reply = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            if reply.get("Errors"):
                first = reply["Errors"][0]
                raise TransientStorageError(
                    f"delete: {len(reply['Errors'])} keys not deleted, e.g. "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
        return len(doomed)

    def get_bytes(self, key: str) -> bytes:
        with self._errors("get", key):
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            return bytes(body.read())

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag (what `put_if_unchanged` compares), or None if absent."""
        try:
            with self._errors("get", key):
                found = self._client.get_object(Bucket=self.bucket, Key=key)
                return bytes(found["Body"].read()), str(found["ETag"])
        except ObjectNotFound:
            return None

    def get_first(self, key: str, limit: int) -> bytes:
        """At most the first `limit` (≥ 1) bytes of the object: one ranged GET."""
        with self._errors("get", key):
            body = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=0-{max(limit, 1) - 1}"
            )["Body"]
            return bytes(body.read())

    def get_verified(self, ref: ObjectRef) -> bytes:
        """The bytes `ref` names, checked against its sha256 (`DigestMismatch` if they differ)."""
        data = self.get_bytes(ref.key)
        if sha256_bytes(data) != ref.sha256:
            raise DigestMismatch(
                f"s3://{self.bucket}/{ref.key} does not match its sha256 {ref.sha256[:12]}…"
            )
        return data

    def get_text(self, key: str) -> str:
        return self.get_bytes(key).decode()

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def get_model(self, key: str, cls: type[M]) -> M:
        return cls.model_validate_json(self.get_bytes(key))

    def head(self, key: str) -> ObjectRef | None:
        """The object's ref (size, sha256), or None if absent."""
        meta = self._head_meta(key)
        return None if meta is None else self._ref_of(key, meta)

    def _ref_of(self, key: str, meta: dict[str, Any]) -> ObjectRef:
        """The ref of the object `meta` (a HEAD's reply) describes."""
        digest = meta.get("Metadata", {}).get(SHA256)
        if digest is None:  # written by something else: hash the body
            digest = sha256_bytes(self.get_bytes(key))
        return ObjectRef(key=key, size=int(meta["ContentLength"]), sha256=digest)

    def fingerprint(self, key: str) -> str | None:
        """What tells the object's bytes from another upload's without reading them: its size,
        ETag and sha256 metadata (one HEAD); None if absent."""
        meta = self._head_meta(key)
        if meta is None:
            return None
        digest = meta.get("Metadata", {}).get(SHA256, "")
        return f"{meta.get('ContentLength')} {meta.get('ETag')} {digest}"

    def exists(self, key: str) -> bool:
        return self._head_meta(key) is not None

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every key under `prefix`, in lexicographic order, `page_size` per request."""
        return self._list(prefix, "Contents", "Key")

    def list_prefixes(self, prefix: str) -> Iterator[str]:
        """The "directories" right under `prefix` (which should end in "/"), e.g. `runs/r1/`."""
        return self._list(prefix, "CommonPrefixes", "Prefix", Delimiter="/")

    def download_file(self, key: str, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("download", key):
            self._client.download_file(self.bucket, key, str(path), Config=self._transfer)

    def download_dir(self, prefix: str, local_dir: Path | str) -> list[Path]:
        """Download every key under `prefix` to `local_dir/<rest of key>`; refuses `..` escapes."""
        root = Path(local_dir).resolve()
        base = prefix.rstrip("/") + "/"
        written = []
        for key in self.list_keys(base):
            if key.endswith("/"):  # folder marker, or `base` itself: as a file it blocks a dir
                continue
            target = (root / key[len(base) :]).resolve()
            if not target.is_relative_to(root):
                raise PermanentStorageError(f"key {key!r} would escape {root}")
            self.download_file(key, target)
            written.append(target)
        return written

    def _list(self, prefix: str, section: str, field: str, **extra: str) -> Iterator[str]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=prefix,
            PaginationConfig={"PageSize": self.page_size},
            **extra,
        )
        with self._errors("list", prefix):
            for page in pages:
                yield from (item[field] for item in page.get(section, []))

    def _head_meta(self, key: str) -> dict[str, Any] | None:
        try:
            with self._errors("head", key):
                return dict(self._client.head_object(Bucket=self.bucket, Key=key))
        except ObjectNotFound:
            return None

    def _existing_or_raise(self, ref: ObjectRef, existing: ObjectRef | None = None) -> ObjectRef:
        existing = existing if existing is not None else self.head(ref.key)  # one HEAD, not two
        if existing is None:  # refused, yet nothing there: a concurrent writer's, not visible yet
            raise TransientStorageError(
                f"s3://{self.bucket}/{ref.key}: create-only write refused, no object visible yet"
            )
        if existing.sha256 == ref.sha256 and existing.size == ref.size:
            return existing
        raise ObjectExists(
            f"s3://{self.bucket}/{ref.key} already holds different content "
            f"(stored sha256 {existing.sha256[:12]}…, new {ref.sha256[:12]}…)"
        )

    def _errors(self, op: str, key: str = "") -> contextlib.AbstractContextManager[None]:
        return translate_errors(op, key, self.endpoint, self.bucket, self.settings.access_key)
