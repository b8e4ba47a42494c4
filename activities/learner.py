"""Activities of the `learner` queue: `prepare_run` (publish version 0), `train_step` (GRPO),
`store_step_groups` (a part of a step's groups, stored where they would pass a payload in its
request or in the learner's state) and `load_step_groups` (one read back: activities/
learner_groups.py).

Served by `tempered worker learner` (workers/learner.py), one activity at a time: the DeepSpeed
engine lives in this object across steps (in this process, or as `learner.ranks` ranks under
torchrun that this process drives, see infra/learner_ranks.py), so consecutive steps never
reload weights. A rank group that dies fails the step as retryable (`LearnerInfraError`); the
next attempt starts a fresh group, which reloads the last published version.

`train_step(step=n)` produces policy version n + 1 exactly once (a request whose groups are stored
in parts, `group_parts`, has them read first: what follows sees them inline):
1. the ack `keys.learner_ack_key(run, n)` exists → return the response recorded in it;
2. version n + 1 is already published (a retry after a publish whose ack was lost) → rebuild the
   ack from the `train_step.json` that is part of that version, and return it; no training;
3. otherwise make the engine hold version n (reloading it from the store after a crash, or after
   an attempt whose weights never got published), read and verify the groups' trajectories,
   run the GRPO step in a thread (heartbeating), save, write `train_step.json` (which
   trajectories made this version) into the directory, publish it as version n + 1 (first
   publisher wins), then write the ack create-only and return. With `GRPOConfig.lora_rank > 0`
   the version is a LoRA adapter directory over the run's version 0 (`PolicyVersion.adapter_of`):
   LoRA is fixed for a run, and a step that asks for it on a full-weight version above 0 is
   refused as invalid, by a warm engine and a restarted one alike.
A cancelled step stops: the cancel (delivered with a heartbeat) stops its thread at the next
micro-batch (a rank group at once, its ranks killed), the engine drops the unpublished weights
(the next step reloads), nothing is published, and the activity reports the cancel once the
thread has ended, so the learner workflow (which waits for it) ends after its step did, and a
step of a later run does not queue behind a cancelled one's compute. A thread cannot be killed,
only asked: one whose micro-batch hangs (a wedged device) or runs long (a huge batch) is left
behind after `STOP_WAIT_S`, and the cancel reported all the same; it holds the engine until it
ends, stops there and publishes nothing (every way to a version checks the stop first), and a
step that waits for the engine meanwhile stops at once if cancelled. The thread is a daemon
(`infra.learner_steps.in_daemon_thread`): the worker exits at SIGTERM without it.
Publishing is the commit point: the last stop check is just before the version's manifest is
written (create-only). A cancel that arrives later (while the manifest is written) stops
nothing: the version is out, once, with its ack, though the activity reports the cancel; any
retry, on this worker (after the thread ends) or another, answers with it (1, 2) and trains
nothing, and an attempt that overlaps it loses the publish and answers with it too (one asked
for other groups, as after a reset of the learner, is refused as a STORED_CONFLICT).

The ack lists every trajectory id trained on (its tokens were in the applied update), every
one skipped with the reason (a group whose samples all scored the same gives no gradient), and
every one dropped as stale, so "trained on exactly once" is auditable from the store alone.
A step's `reward_mean` is the mean reward of every group sent to it (a flat one, a stale one
dropped included: what the rollouts scored); its `duration_s` runs from the activity's start
(waiting for the engine, loading, reading included) to the version saved, its record written
(the record is part of the version: its upload after is not in it, and every answer of the step
is the same); the optimizer's part is `metrics.optimizer_s`. The telemetry's step time runs on
to the version published.
The step's telemetry (its time, its trajectories' staleness) is recorded by the attempt whose
version was published, once: not by an answer from a recorded step (1, 2), nor by an attempt that
failed or lost the publish to another.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity

from activities.heartbeat import CANCEL_GRACE_S, heartbeating
from activities.learner_groups import get_step_groups, put_step_groups, read_group, with_groups
from contracts.common import ObjectRef
from contracts.errors import ErrorType, fail, invalid
from contracts.learner import (
    GRPOConfig,
    PolicyVersion,
    StepGroups,
    StepRecord,
    TrainStepRequest,
    TrainStepResponse,
)
from contracts.names import Activity
from contracts.run import PrepareRunRequest, RunRecord
from infra import keys
from infra.base_models import materialize_base_model
from infra.learner_base import ConfigRefused, Learner, NonFiniteLoss
from infra.learner_ranks import RankGroupFailed, open_learner
from infra.learner_steps import (
    STEP_RECORD,
    acknowledge,
    attempt_dir,
    in_daemon_thread,
    load_version,
    lora_fixed,
    pinned_version,
    recorded_step,
    same_groups,
    stop_if_asked,
    sweep_attempts,
)
from infra.policy import advance_latest, policy_manifest, publish_policy
from infra.run_ids import removal_record
from infra.settings import Settings
from infra.storage import ObjectExists, ObjectStore
from infra.telemetry import record_learner_step, record_queue_wait, record_staleness, span

T = TypeVar("T")
STOP_WAIT_S = CANCEL_GRACE_S
"""How long a cancelled activity waits for its thread to stop before it reports the cancel and
leaves the thread behind: the cleanup time the worker's shutdown allows a cancelled activity
(`workers.background.STOP_MARGIN_S`); a micro-batch longer than that ends after the cancel."""
LOCK_POLL_S = 0.2
"""How often a step waiting for the engine looks at its stop."""
log = logging.getLogger(__name__)


class LearnerActivities:
    """The learner's activities; holds the object store and the DeepSpeed engine."""

    def __init__(self, settings: Settings, store: ObjectStore | None = None):
        self.settings = settings
        self.store = store or ObjectStore.from_settings(settings)
        self.work_dir = settings.home / "learner"
        sweep_attempts(self.work_dir)
        self.engine: Learner | None = None  # built on the first step
        self._engine_run: str | None = None
        self._engine_lock = threading.Lock()

    @activity.defn(name=Activity.PREPARE_RUN)
    async def prepare_run(self, req: PrepareRunRequest) -> PolicyVersion:
        """Publish `req.base_model` as version 0 of the run; a no-op when v0 already exists.
        A run id `tempered runs rm` removed is refused: workers that served that run may still
        hold its policies and ledger segments in memory and caches, under the same names."""
        removed = await asyncio.to_thread(removal_record, self.store, req.run_id)
        if removed is not None:
            raise invalid(
                "run_id",
                f"run id {req.run_id!r} belonged to a run `tempered runs rm` removed (record "
                f"{removed.key}); workers may still cache its policies: choose another run id",
            )
        if req.run is not None:  # what `tempered runs show`, `regrade` and `eval` read back
            record = RunRecord.of(req.run, req.heldout)
            try:
                await asyncio.to_thread(
                    self.store.put_json, keys.run_record_key(req.run_id), record, create_only=True
                )
            except ObjectExists:
                raise invalid(
                    "run_id", f"run {req.run_id!r} already exists with other settings"
                ) from None
        manifest = await asyncio.to_thread(policy_manifest, self.store, req.run_id, 0)
        if manifest is not None:
            await asyncio.to_thread(advance_latest, self.store, manifest.policy)
            return manifest.policy
        progress = {"phase": "materialize", "base_model": req.base_model}
        try:
            base = await _in_thread(
                lambda _: materialize_base_model(req.base_model, self.settings, self.store),
                progress,
            )
        except ValueError as exc:
            raise invalid("base_model", str(exc)) from exc
        progress["phase"] = "publish"
        return await _in_thread(
            lambda _: publish_policy(self.store, req.run_id, 0, base, step=0), progress
        )

    @activity.defn(name=Activity.STORE_STEP_GROUPS)
    async def store_step_groups(self, part: StepGroups) -> ObjectRef:
        """Store one part of a step's groups, once (a retry finds it stored)."""
        return await asyncio.to_thread(put_step_groups, self.store, part)

    @activity.defn(name=Activity.LOAD_STEP_GROUPS)
    async def load_step_groups(self, ref: ObjectRef) -> StepGroups:
        """One stored part of groups, read back (the learner's carried pending groups)."""
        return await asyncio.to_thread(get_step_groups, self.store, ref)

    @activity.defn(name=Activity.TRAIN_STEP)
    async def train_step(self, req: TrainStepRequest) -> TrainStepResponse:
        """Produce policy version `req.step + 1` from its groups, exactly once."""
        started = time.perf_counter()  # the step's time is its whole activity's (`_train`)
        progress: dict[str, Any] = {"phase": "waiting for the engine", "step": req.step}
        record_queue_wait()
        with span(
            "learner.train_step",
            run_id=req.run_id,
            step=req.step,
            policy_version=req.step + 1,
            groups=len(req.groups),
            group_parts=len(req.group_parts),
        ):
            return await _in_thread(lambda stop: self._step(req, progress, stop, started), progress)

    # -- the step, in a thread ----------------------------------------------------------------

    def _step(
        self, req: TrainStepRequest, progress: dict[str, Any], stop: threading.Event, started: float
    ) -> TrainStepResponse:
        if req.group_parts:
            progress["phase"] = "read groups"
            req = with_groups(self.store, req)  # what follows sees every group inline
            progress["phase"] = "waiting for the engine"
        with self._engine_held(stop, req.step):
            progress["phase"] = "check"
            done = self._recorded(req)
            if done is not None:
                return done
            if self.engine is None:
                ranks_log = self.settings.home / "logs" / "learner-ranks.log"
                self.engine = open_learner(self.settings.learner, ranks_log)
            try:
                with self.engine.stopping(stop), contextlib.ExitStack() as pins:
                    return self._train(req, progress, stop, started, pins)
            except RankGroupFailed as exc:  # the group is gone; the retry starts a fresh one
                raise fail(ErrorType.LEARNER_INFRA, f"step {req.step}: {exc}") from exc

    @contextlib.contextmanager
    def _engine_held(self, stop: threading.Event, step: int) -> Iterator[None]:
        """The engine to this step alone, waited for until `stop` is set. A thread lock, not an
        asyncio one: an attempt whose heartbeats were lost (timed out, not cancelled) runs on,
        as does a cancelled step's thread left behind, and a step on this worker must wait for
        it (and then find its published result) instead of training the same engine at once."""
        while not self._engine_lock.acquire(timeout=LOCK_POLL_S):
            stop_if_asked(stop, step)
        try:
            yield
        finally:
            self._engine_lock.release()

    def close(self) -> None:
        """Release the engine (end the rank group); the worker calls it at shutdown. A thread
        left behind by a cancel (`STOP_WAIT_S`) that still holds the engine keeps it: a rank
        group ends with the worker (rank 0 reads the socket's end), an engine in this process
        holds nothing to release, and the worker exits without that (daemon) thread."""
        if not self._engine_lock.acquire(timeout=STOP_WAIT_S):
            log.warning("learner: a step's thread still holds the engine; not closed")
            return
        try:
            if self.engine is not None:
                self.engine.close()
        finally:
            self._engine_lock.release()

    def _recorded(self, req: TrainStepRequest) -> TrainStepResponse | None:
        """The answer of a step already done (`recorded_step`), or None: train it."""
        return recorded_step(self.store, req)

    def _train(
        self,
        req: TrainStepRequest,
        progress: dict[str, Any],
        stop: threading.Event,
        started: float,
        pins: contextlib.ExitStack,
    ) -> TrainStepResponse:
        """Train, save and publish version `req.step + 1`; `started` (`perf_counter`) is the
        activity's start, where the step's `duration_s` begins; `pins` hold what it loads."""
        stop_if_asked(stop, req.step)  # cancelled while it waited for the engine
        engine = self._engine_at(req.run_id, req.step, req.config, progress, pins)
        stop_if_asked(stop, req.step)  # or while it loaded (the version it holds stays good)
        progress["phase"] = "read trajectories"
        groups = [read_group(self.store, req, g) for g in range(len(req.groups))]
        rewards = [t.reward for group in groups for t in group]  # of every group sent

        def beat() -> None:
            stop_if_asked(stop, req.step)
            progress["micro_batches"] = progress.get("micro_batches", 0) + 1

        progress["phase"] = "train"
        try:
            try:
                metrics = engine.train_step(groups, req.config, heartbeat=beat)
                stop_if_asked(stop, req.step)  # the last chance before the version is out
            except BaseException:  # cancelled, out of memory, ...: a retry must not start from
                engine.version = None  # gradients (or an epoch's update) of this attempt: reload
                raise
        except ConfigRefused as exc:  # the run's settings: share_prompt on a sliding window,
            # LoRA settings changed mid-run
            raise invalid("config", str(exc)) from exc
        except ValueError as exc:  # a trajectory that cannot be trained on (token/logprob counts)
            raise invalid("groups", str(exc)) from exc
        except NonFiniteLoss as exc:  # the same groups would diverge again: fail loudly
            raise fail(ErrorType.NON_FINITE_LOSS, f"step {req.step}: {exc}") from exc
        attempt = uuid.uuid4().hex
        figures = metrics.summary()
        figures["optimizer_s"] = figures.pop("duration_s")  # the engine's part of the step
        progress["phase"] = "publish"
        out = attempt_dir(self.work_dir, req.run_id, req.step + 1, attempt)
        base = engine.adapter_of
        try:
            engine.save(out, base_name=f"{req.run_id}/v{base}" if base is not None else "")
            record = StepRecord(
                run_id=req.run_id,
                step=req.step,
                attempt=attempt,
                groups=[group.task_id for group in req.groups],
                loss=metrics.loss,
                trained=metrics.trained,
                skipped=metrics.skipped,
                dropped_stale=metrics.dropped_stale,
                reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
                duration_s=time.perf_counter() - started,  # to the version saved
                metrics=figures,
            )
            (out / STEP_RECORD).write_text(record.model_dump_json(indent=1))
            stop_if_asked(stop, req.step)  # saving took seconds; uploading may take more
            policy = publish_policy(
                self.store,
                req.run_id,
                req.step + 1,
                out,
                step=req.step + 1,
                adapter_of=base,
                before_manifest=lambda: stop_if_asked(stop, req.step),
            )
        except BaseException:
            engine.version = None  # weights moved on but were not published: reload next time
            raise
        finally:
            shutil.rmtree(out, ignore_errors=True)
        response, published = acknowledge(self.store, policy)
        if published.attempt != attempt:
            engine.version = None  # another attempt's weights won the publish: reload them
            same_groups(published, req)  # for other groups (a reset's old branch): refused
        else:  # the step is recorded once, by the attempt whose version is out
            record_learner_step(time.perf_counter() - started)  # to the version published
            for trajectory in (t for group in groups for t in group if t.steps):
                record_staleness(req.step - trajectory.policy_version)  # of what a policy made
        return response

    def _engine_at(
        self,
        run_id: str,
        step: int,
        config: GRPOConfig,
        progress: dict[str, Any],
        pins: contextlib.ExitStack,
    ) -> Learner:
        """The engine holding version `step` of `run_id`, reloaded from the store if needed. What
        it reads is pinned in the machine's cache until `pins` closes (after the step): a LoRA
        version's adapter, while its base is fetched, and the KL reference, read at first use."""
        assert self.engine is not None  # opened by _step
        pinned = functools.partial(pinned_version, self.store, self.settings, run_id)
        if self._engine_run != run_id or self.engine.version != step:
            progress["phase"] = f"load v{step}"

            def fetch(version: int) -> Path:  # pinned until the step ends
                return pins.enter_context(pinned(version))

            progress["load_s"] = round(load_version(self.engine, run_id, step, config, fetch), 2)
            self._engine_run = run_id
        else:
            lora_fixed(run_id, step, config, full_weights=self.engine.adapter_of is None)
        if config.kl_coef > 0:
            self.engine.set_reference(pins.enter_context(pinned(0)))
        return self.engine


async def _in_thread(work: Callable[[threading.Event], T], progress: dict[str, Any]) -> T:
    """Run blocking `work(stop)` in a daemon thread, heartbeating `progress` (which it updates)
    meanwhile. Cancelled, it sets `stop` and waits for the thread to end (still heartbeating),
    for `STOP_WAIT_S` at most, before the cancel goes on: a thread cannot be killed, only
    asked, and one that does not stop by then is left behind (what it raises then is logged;
    the process's exit does not wait for it)."""
    stop = threading.Event()
    thread = in_daemon_thread(work, stop, "learner-step")

    def details() -> dict[str, Any]:
        return dict(progress)

    try:
        return await heartbeating(asyncio.shield(thread), details=details)
    except asyncio.CancelledError:
        stop.set()
        phase = progress.get("phase")
        progress["phase"] = f"cancelled in {phase}: stopping"
        stopping = heartbeating(asyncio.shield(thread), details=details)
        try:
            with contextlib.suppress(Exception):  # TimeoutError too: the cancel goes on
                await asyncio.wait_for(stopping, STOP_WAIT_S)
        finally:  # also when cancelled again meanwhile
            if not thread.done():
                log.warning("learner: a thread cancelled in %s runs on: left behind", phase)
                thread.add_done_callback(functools.partial(_ended_late, phase))
        raise


def _ended_late(phase: object, thread: asyncio.Future[Any]) -> None:
    """Log how a thread a cancel left behind ended (StepStopped, unless it was past its last
    stop check): its outcome is no one's to retrieve."""
    outcome = "cancelled" if thread.cancelled() else thread.exception() or "done"
    log.warning("learner: the thread cancelled in %s ended: %r", phase, outcome)
