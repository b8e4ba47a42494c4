"""The `write_trajectories` activity (queue `rewards`): one finished agent task → G trajectories.

Each sample's stored turn artefacts (completion.json, code.py, result.json) are assembled into a
`contracts.trajectory.Trajectory` and written create-only at `keys.trajectory_key`. The document
is a pure function of the request and of those artefacts (its timestamps come from the
completion records, never from the clock), so a retried activity writes identical bytes and
reports `created=0`.

Storage failures propagate as retryable errors (S3 down is never a reward); a request that can
never succeed (no turns, an `infra_error` turn, an artefact whose digest does not match its ref,
a different trajectory already stored under the key) raises a non-retryable ApplicationError.

Served by `tempered worker rewards` (workers/rewards.py).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity

from contracts.common import ObjectRef
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity
from contracts.rollout import (
    CompletionRecord,
    SampleState,
    TurnRecord,
    WriteTrajectoriesRequest,
    WriteTrajectoriesResponse,
)
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.trajectory import Trajectory, TrajectoryTurn, trajectory_id
from infra import keys
from infra.storage import DigestMismatch, ObjectExists, ObjectStore, sha256_bytes
from infra.telemetry import record_rewards

M = TypeVar("M", bound=BaseModel)


class RewardActivities:
    """Activities of the rewards queue; holds the object store they write to."""

    def __init__(self, store: ObjectStore):
        self.store = store

    @activity.defn(name=Activity.WRITE_TRAJECTORIES)
    async def write_trajectories(self, req: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        if not req.samples:
            raise invalid("samples", "no samples to write")
        trajectories = await asyncio.gather(
            *(asyncio.to_thread(self._assemble, req, i, s) for i, s in enumerate(req.samples))
        )
        activity.heartbeat("assembled")
        written = await asyncio.gather(
            *(asyncio.to_thread(self._write_once, req.run_id, t) for t in trajectories)
        )
        refs = [ref for ref, _ in written]
        created = sum(new for _, new in written)
        record_rewards(
            sum(s.reward for s in req.samples) / len(req.samples),
            sum(s.solved for s in req.samples) / len(req.samples),
            run_id=req.run_id,
        )
        return WriteTrajectoriesResponse(trajectories=refs, created=created)

    def _assemble(
        self, req: WriteTrajectoriesRequest, index: int, sample: SampleState
    ) -> Trajectory:
        where = f"samples[{index}]"
        if not sample.turns:
            raise invalid(f"{where}.turns", f"sample {sample.sample} has no turns")
        turns = [self._turn(f"{where}.turns[{k}]", turn) for k, turn in enumerate(sample.turns)]
        last = turns[-1]
        return Trajectory(
            id=trajectory_id(req.run_id, req.task.id, sample.sample),
            run_id=req.run_id,
            task_id=req.task.id,
            sample=sample.sample,
            group_size=req.group_size,
            prompt=req.task.prompt,
            turns=turns,
            reward=sample.reward,
            solved=sample.solved,
            policy_version=last.policy_version,
            created_at=last.finished_at or last.started_at,
        )

    def _turn(self, where: str, turn: TurnRecord) -> TrajectoryTurn:
        completion = self._load(f"{where}.completion", turn.completion, CompletionRecord)
        code = self._read(f"{where}.code", turn.code).decode()
        result = (
            self._load(f"{where}.result", turn.result, ExecutionResult) if turn.result else None
        )
        status = result.status if result else turn.status
        if status is None:
            raise invalid(f"{where}.status", "turn was never executed (no status, no result)")
        if status == ExecStatus.INFRA_ERROR:
            raise invalid(f"{where}.status", "infra_error is a platform fault, never a reward")
        return TrajectoryTurn(
            turn=turn.turn,
            policy_version=turn.policy_version,
            prompt_token_ids=completion.prompt_token_ids,
            completion_token_ids=completion.completion_token_ids,
            completion_logprobs=completion.logprobs,
            completion_text=completion.text,
            code=code,
            status=status,
            tests_passed=result.tests_passed if result else turn.tests_passed,
            tests_total=result.tests_total if result else turn.tests_total,
            reward=turn.reward if turn.reward is not None else 0.0,
            started_at=completion.started_at,
            finished_at=completion.finished_at,
        )

    def _read(self, where: str, ref: ObjectRef) -> bytes:
        try:
            return self.store.get_verified(ref)
        except DigestMismatch as exc:
            raise invalid(where, str(exc)) from exc

    def _load(self, where: str, ref: ObjectRef, cls: type[M]) -> M:
        return cls.model_validate_json(self._read(where, ref))

    def _write_once(self, run_id: str, trajectory: Trajectory) -> tuple[ObjectRef, bool]:
        """Create-only write; (ref, True) when new, (ref, False) when already stored (a retry)."""
        key = keys.trajectory_key(run_id, trajectory.task_id, trajectory.sample)
        data = trajectory.model_dump_json().encode()
        stored = self.store.head(key)
        if stored is not None and stored.sha256 == sha256_bytes(data):
            return stored, False
        try:
            ref = self.store.put_bytes(key, data, create_only=True, content_type="application/json")
        except ObjectExists as exc:  # a different trajectory: the rollout was not deterministic
            raise fail(ErrorType.STORED_CONFLICT, str(exc)) from exc
        return ref, True
