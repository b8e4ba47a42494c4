"""`tempered eval --policy DIR` hashes each file of DIR once, and a repeat eval once more.

`_publish` hashed the whole directory for `policy_digest` and again in `publish_policy` (a
517 MB SmolLM2 read twice per eval); a repeat eval, whose version 0 was already there, hashed
it twice too. Real SeaweedFS; the hash function is the real one, wrapped to count its calls.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import infra.policy
import infra.storage
from infra.policy import policy_manifest
from infra.storage import MULTIPART_THRESHOLD, ObjectStore
from tests.fixtures.cli_settings import cli_settings
from workers.cli.evaluate import _publish

FILES = ("config.json", "large.safetensors", "model.safetensors", "tokenizer.json")


def model_dir(root: Path) -> Path:
    out = root / "model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": "hash-once"}))
    (out / "model.safetensors").write_bytes(b"weights" * 4000)
    (out / "tokenizer.json").write_text(json.dumps({"vocab": ["a", "b"]}))
    with (out / "large.safetensors").open("wb") as large:  # sent in parts: hashed there too once
        large.truncate(MULTIPART_THRESHOLD + 1)
    return out


def test_an_eval_and_its_repeat_hash_each_file_once(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = cli_settings(tmp_path / "home", store)
    local = model_dir(tmp_path)
    hashed: Counter[str] = Counter()
    real = infra.storage.sha256_file

    def counting(path: Path) -> str:
        hashed[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(infra.policy, "sha256_file", counting)
    monkeypatch.setattr(infra.storage, "sha256_file", counting)

    run = _publish(str(local), settings, store)
    assert hashed == Counter(dict.fromkeys(FILES, 1)), "first eval"
    manifest = policy_manifest(store, run, 0)
    assert manifest is not None and sorted(manifest.files) == sorted(FILES)

    hashed.clear()
    assert _publish(str(local), settings, store) == run
    assert hashed == Counter(dict.fromkeys(FILES, 1)), "repeat eval"
