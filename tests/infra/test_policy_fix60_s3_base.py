"""An `s3://` base model is the store's current checkpoint, of the store asked (real SeaweedFS;
infra/base_models.py).

Its local copy was named after the prefix alone and reused once it held config.json: a
checkpoint uploaded again to the same prefix, or the same prefix in another bucket, silently
gave the first copy's weights, which became a new run's version 0."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import base_models
from infra.base_models import materialize_base_model
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.storage_errors import TransientStorageError
from tests.fixtures.s3 import SeaweedServer

PREFIX = "models/sft"


def _upload(store: ObjectStore, tmp_path: Path, tag: str) -> None:
    """A checkpoint tagged `tag` (its config and weights say which it is) at PREFIX."""
    src = tmp_path / f"src-{tag}-{store.bucket}"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"sft": tag}))
    (src / "model.safetensors").write_text(tag * 10)
    store.upload_dir(src, PREFIX)


def _tag(local: Path) -> str:
    tag: str = json.loads((local / "config.json").read_text())["sft"]
    assert (local / "model.safetensors").read_text() == tag * 10
    return tag


def test_a_checkpoint_uploaded_again_is_downloaded_again(
    store: ObjectStore, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    _upload(store, tmp_path, "A")
    first = materialize_base_model(f"s3://{PREFIX}/", settings, store)
    assert _tag(first) == "A"
    _upload(store, tmp_path, "B")  # a new SFT checkpoint, same prefix
    again = materialize_base_model(f"s3://{PREFIX}/", settings, store)
    assert again != first and _tag(again) == "B"
    assert _tag(first) == "A"  # never replaced under a reader that was given it


def test_a_store_that_cannot_be_asked_serves_the_newest_copy(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 down at a worker's start: its cached copy serves (every call lists the prefix now; an
    outage failed the start of a worker holding a complete copy). Without a copy: the error."""
    settings = Settings(home=tmp_path / "home")
    _upload(store, tmp_path, "A")
    first = materialize_base_model(f"s3://{PREFIX}", settings, store)

    def down(prefix: str) -> Iterator[str]:
        raise TransientStorageError("connection refused")

    monkeypatch.setattr(store, "list_keys", down)
    assert materialize_base_model(f"s3://{PREFIX}", settings, store) == first
    with pytest.raises(TransientStorageError):
        materialize_base_model("s3://models/other", settings, store)


def test_the_same_prefix_in_another_bucket_is_another_copy(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    other = seaweed.store()
    try:
        _upload(store, tmp_path, "A")
        _upload(other, tmp_path, "C")
        assert _tag(materialize_base_model(f"s3://{PREFIX}", settings, store)) == "A"
        assert _tag(materialize_base_model(f"s3://{PREFIX}", settings, other)) == "C"
        assert _tag(materialize_base_model(f"s3://{PREFIX}", settings, store)) == "A"
    finally:
        seaweed.drop(other.bucket)


def test_an_unchanged_checkpoint_is_not_downloaded_again(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path / "home")
    _upload(store, tmp_path, "A")
    downloads: list[str] = []
    download = base_models.download_prefix

    def counted(store: ObjectStore, prefix: str, out: Path) -> None:
        downloads.append(prefix)
        download(store, prefix, out)

    monkeypatch.setattr(base_models, "download_prefix", counted)
    first = materialize_base_model(f"s3://{PREFIX}", settings, store)
    assert materialize_base_model(f"s3://{store.bucket}/{PREFIX}/", settings, store) == first
    assert downloads == [f"{PREFIX}/"] and _tag(first) == "A"
    store.delete(f"{PREFIX}/model.safetensors")  # the checkpoint is gone: no stale copy served
    with pytest.raises(FileNotFoundError):
        _tag(materialize_base_model(f"s3://{PREFIX}", settings, store))
