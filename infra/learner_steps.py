"""The learner's step bookkeeping: what a step records, where an attempt writes its version, the
answer of a step from its record, how it loads a version (pinned in the machine's cache), and
the thread a step runs in (activities/learner.py drives them).

    out = attempt_dir(work_dir, run_id, step + 1, attempt)   # `<run>/.v<N>.<id>`, removed after
    sweep_attempts(work_dir)                                 # what a killed learner left there
    recorded_step(store, req)                                # a done step's answer, or None
    response, record = acknowledge(store, policy)            # the ack of a published version
    with pinned_version(store, settings, run, v) as local:   # a version to load, kept cached
    load_s = load_version(engine, run, step, config, fetch)  # the engine at `step`: its files
    future = in_daemon_thread(work, stop, "learner-step")    # work(stop), awaitable
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from contracts.common import ObjectRef
from contracts.errors import ErrorType, fail, invalid
from contracts.learner import (
    GRPOConfig,
    PolicyManifest,
    PolicyVersion,
    StepRecord,
    TrainStepRequest,
    TrainStepResponse,
)
from infra import keys
from infra.learner_base import Learner, StepStopped
from infra.policy import MANIFEST, advance_latest, policy_manifest
from infra.policy_cache import pinned_policy
from infra.settings import Settings
from infra.storage import ObjectNotFound, ObjectStore

T = TypeVar("T")

STEP_RECORD = "train_step.json"
"""Which trajectories made a version: a file of the version itself."""
ATTEMPT_DIRS = "*/.v*.*"
"""Each attempt's version while it saves and publishes, under the work dir: `<run>/.v<N>.<id>`."""


def attempt_dir(work_dir: Path, run_id: str, version: int, attempt: str) -> Path:
    """Where `attempt` writes version `version` of `run_id` before it publishes it."""
    return work_dir / run_id / f".v{version}.{attempt[:8]}"  # matched by ATTEMPT_DIRS


def sweep_attempts(work_dir: Path) -> None:
    """Remove the attempt directories a learner killed outright (SIGKILL, OOM) while it saved or
    published left behind, each a full copy of the weights (removed in a `finally` otherwise).
    Called as the activities start, when no attempt of this worker can be in flight; another
    learner worker on the same home would lose its attempt in flight (one per home is assumed)."""
    for path in work_dir.glob(ATTEMPT_DIRS):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def lora_fixed(run_id: str, step: int, config: GRPOConfig, full_weights: bool) -> None:
    """Refuse LoRA on a full-weight version above 0 (a run trains adapters from v0 or never): a
    warm engine refused the switch, while a restarted one wrapped new adapters over the version
    and trained, so the outcome hung on a restart."""
    if full_weights and step > 0 and config.lora_rank > 0:
        raise invalid(
            "config",
            f"version {step} of run {run_id} holds full weights, and this step asks for LoRA "
            f"(lora_rank {config.lora_rank}): LoRA settings (lora_rank, lora_alpha, "
            "lora_target_modules, train_last_layers) are fixed for a run",
        )


def same_groups(record: StepRecord, req: TrainStepRequest) -> None:
    """Refuse to answer `req` with a step recorded for other groups (never a silent "done")."""
    asked = sorted(group.task_id for group in req.groups)
    if sorted(record.groups) != asked:
        raise fail(
            ErrorType.STORED_CONFLICT,
            f"step {req.step} of run {req.run_id} is recorded for groups {sorted(record.groups)},"
            f" not for the {asked} it is asked to train",
        )


def step_response(record: StepRecord, ack: ObjectRef) -> TrainStepResponse:
    """The answer of the step `record` (with its policy) records, acknowledged by `ack`."""
    if record.policy is None:
        raise ValueError(f"ack {ack.key} names no policy")
    return TrainStepResponse(
        policy=record.policy,
        loss=record.loss,
        trained=len(record.trained),
        skipped=len(record.skipped),
        dropped_stale=len(record.dropped_stale),
        reward_mean=record.reward_mean,
        duration_s=record.duration_s,
        ack=ack,
    )


def recorded_step(store: ObjectStore, req: TrainStepRequest) -> TrainStepResponse | None:
    """The response of a step already done (ack written, or version published: by any attempt,
    a cancelled one included), when it was done for exactly the groups `req` asks for; any
    other recorded step is an error. Moves latest.json on: the publisher may have died first."""
    ack = store.head(keys.learner_ack_key(req.run_id, req.step))
    if ack is not None:
        record = store.get_model(ack.key, StepRecord)
        same_groups(record, req)
        response = step_response(record, ack)
    else:
        manifest = policy_manifest(store, req.run_id, req.step + 1)
        if manifest is None:
            return None
        response, record = acknowledge(store, manifest.policy, manifest)
        same_groups(record, req)
    advance_latest(store, response.policy)
    return response


def acknowledge(
    store: ObjectStore, policy: PolicyVersion, manifest: PolicyManifest | None = None
) -> tuple[TrainStepResponse, StepRecord]:
    """Write (create-only: every writer writes the same bytes) the ack of the step that produced
    `policy`, from the train_step.json its manifest names (read here unless given)."""
    manifest = manifest or policy_manifest(store, policy.run_id, policy.version)
    if manifest is None or STEP_RECORD not in manifest.files:
        raise invalid("step", f"policy {policy.run_id}/v{policy.version} has no {STEP_RECORD}")
    record = StepRecord.model_validate_json(store.get_verified(manifest.files[STEP_RECORD]))
    record.policy = policy
    ack = store.put_json(keys.learner_ack_key(policy.run_id, record.step), record, create_only=True)
    return step_response(record, ack), record


def pinned_version(
    store: ObjectStore, settings: Settings, run_id: str, version: int
) -> contextlib.AbstractContextManager[Path]:
    """Version `version` of `run_id` in the machine's policy cache, pinned there while the
    block runs (`pinned_policy`): a LoRA version's adapter stays while its base is fetched."""
    keep = settings.s3.policy_cache_versions
    return pinned_policy(store, run_id, version, settings.policy_cache, keep)


def load_version(
    engine: Learner, run_id: str, step: int, config: GRPOConfig, fetch: Callable[[int], Path]
) -> float:
    """Load version `step` of `run_id` into `engine` from where `fetch(version)` puts it (a LoRA
    version: its adapter over the full weights it names, fetched too); the seconds it took."""
    try:
        local = fetch(step)
    except ObjectNotFound as exc:
        raise invalid("step", f"policy version {step} of run {run_id} is not published") from exc
    policy = PolicyManifest.model_validate_json((local / MANIFEST).read_bytes()).policy
    lora_fixed(run_id, step, config, full_weights=policy.adapter_of is None)
    started = time.perf_counter()
    try:
        if policy.adapter_of is None:
            engine.load(local, step, config)
        else:  # a LoRA version: its adapter over the full weights it names
            base = fetch(policy.adapter_of)
            engine.load(base, step, config, adapter_dir=local, adapter_of=policy.adapter_of)
    except ValueError as exc:  # e.g. a LoRA version asked to train full weights
        raise invalid("config", str(exc)) from exc
    return time.perf_counter() - started


def stop_if_asked(stop: threading.Event, step: int) -> None:
    """A step's stop check: `StepStopped` once its activity was cancelled."""
    if stop.is_set():
        raise StepStopped(f"step {step} was cancelled")


def in_daemon_thread(
    work: Callable[[threading.Event], T], stop: threading.Event, name: str
) -> asyncio.Future[T]:
    """`work(stop)` in a daemon thread of its own (with the caller's context, as
    `asyncio.to_thread`), its outcome the returned future's, on the running loop.

    Not an executor's thread: the interpreter's exit joins those (and `asyncio.run`'s end, with
    no bound before Python 3.12), so a step a cancel left behind in a hung micro-batch kept its
    worker from exiting at SIGTERM until it was killed. A daemon thread is not waited for: the
    process exits with it still in its call. What it may have been doing then is safe to lose:
    its publish is atomic (the version's manifest, create-only, is what makes it exist) and its
    attempt directory is swept at the next start (`sweep_attempts`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(work, stop), None)
        except BaseException as exc:  # the awaiting side raises it
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one awaits it anymore
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
