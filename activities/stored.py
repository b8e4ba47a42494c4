"""Reading a stored artefact an activity was handed, with one error policy.

    record = read_model(store, "items[0].previous", item.previous, CompletionRecord)
    code = read_verified(store, "samples[0].steps[1].code", step.code).decode()
    record = parse_model("items[0]", key, store.get_bytes(key), CompletionRecord)

An artefact that is missing, does not match its ref's digest, or is not a valid document
(`parse_model`: e.g. one a newer release wrote) can never be read however often the activity
is retried: each raises a non-retryable `invalid(where, …)` naming the request's field.
Storage faults propagate and are retried. `missing_retried=True` is for a ref that may come
before its object is visible (environment.py: a turn's record generate stored before its ref
came back): a missing object is then a `TransientStorageError`, retried.
What is not here: deciding whether an object exists at all (`ObjectStore.head`, `get_bytes`).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from contracts.common import ObjectRef, describe_validation_error
from contracts.errors import invalid
from infra.storage import DigestMismatch, ObjectNotFound, ObjectStore, TransientStorageError

M = TypeVar("M", bound=BaseModel)


def read_verified(
    store: ObjectStore, where: str, ref: ObjectRef, *, missing_retried: bool = False
) -> bytes:
    """The bytes `ref` names, checked against its digest (blocking)."""
    try:
        return store.get_verified(ref)
    except ObjectNotFound as exc:
        if missing_retried:
            raise TransientStorageError(
                f"{where}: {ref.key} is not in the store yet; retried"
            ) from exc
        raise invalid(where, f"{ref.key} does not exist") from exc
    except DigestMismatch as exc:
        raise invalid(where, str(exc)) from exc


def parse_model(where: str, key: str, data: bytes, cls: type[M]) -> M:
    """`data` (stored at `key`) as a `cls`."""
    try:
        return cls.model_validate_json(data)
    except ValidationError as exc:
        raise invalid(where, f"{key}: {describe_validation_error(exc)}") from exc


def read_model(
    store: ObjectStore, where: str, ref: ObjectRef, cls: type[M], *, missing_retried: bool = False
) -> M:
    """The `cls` document `ref` names (blocking)."""
    data = read_verified(store, where, ref, missing_retried=missing_retried)
    return parse_model(where, ref.key, data, cls)
