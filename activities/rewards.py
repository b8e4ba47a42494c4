"""The `write_trajectories` activity (queue `rewards`): one finished agent task → G trajectories.

Each episode's stored step records (completion.json, and code.py for `code`) are assembled into
a `contracts.trajectory.Trajectory` (format 2: one token sequence per episode with its loss mask
and sampled log-probs, see `token_sequence`) and written create-only at `keys.trajectory_key`.
A `workspace` step's call is stored whole: the request holds its brief, and a brief that was cut
is parsed again from the step's completion text (`toolcalls.full_call`).
The document is a pure function of the request and of those artefacts (its timestamps come from
the completion records, never from the clock), so a retried activity writes identical bytes and
reports `created=0`. The reward counters (`infra.telemetry.count_rewards`) count the samples
whose trajectory the attempt created, so a retry counts none twice; one whose create-only PUT
was stored but whose response was lost counts as created all the same (`ObjectStore.put_once`
knows its own write again). The activity's span holds the whole group's mean reward and pass
rate (`note_rewards`), whichever attempt wrote it.

Storage failures propagate as retryable errors (S3 down is never a reward); a request that can
never succeed (an episode that never ended, a `code` step never executed, an `infra_error`
step or verdict, an artefact missing, not matching its ref's digest or not a valid record
(`activities/stored.py`), a step whose prompt does not extend the previous step's prompt and
completion, a step's text that does not give its call, a different trajectory already stored
under the key) raises a non-retryable ApplicationError naming the field.

Served by `tempered worker rewards` (workers/rewards.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio import activity

from activities.heartbeat import heartbeating_each
from activities.stored import read_model, read_verified
from contracts.common import ObjectRef
from contracts.episode import WORKSPACE_TOOLS, ToolCall
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity
from contracts.rollout import (
    CompletionRecord,
    EpisodeState,
    EpisodeStep,
    WriteTrajectoriesRequest,
    WriteTrajectoriesResponse,
)
from contracts.sandbox import ExecStatus
from contracts.task import EnvName
from contracts.trajectory import Trajectory, TrajectoryStep, trajectory_id
from infra import keys
from infra.inference.toolcalls import full_call
from infra.storage import JSON, ObjectExists, ObjectStore
from infra.telemetry import count_rewards, note_rewards


class PrefixBroken(ValueError):
    """A step's prompt does not start with the previous step's prompt and completion."""

    def __init__(self, step: int):
        super().__init__(
            f"step {step}'s prompt does not extend step {step - 1}'s prompt and completion "
            "(token in, token out is broken: the ids were re-rendered or re-tokenized)"
        )
        self.step = step


@dataclass
class TokenSequence:
    """An episode's tokens, which of them the policy sampled, and their log-probs."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    logprob_temperature: float = 1.0


def token_sequence(records: Sequence[CompletionRecord]) -> TokenSequence:
    """One sequence from an episode's steps: the last prompt and completion, with a mask of 1
    on every step's completion tokens and 0 on prompt, observation and template tokens.
    Raises PrefixBroken when a step's prompt is not the previous prompt + completion + more,
    ValueError when a record's log-probs are not one per completion token, or were taken at
    another temperature than the first step's (the learner recomputes an episode's at one)."""
    out = TokenSequence()
    if records:
        out.logprob_temperature = records[0].logprob_temperature
    for k, record in enumerate(records):
        completion = record.completion_token_ids
        if len(record.logprobs) != len(completion):
            raise ValueError(
                f"step {k}: {len(record.logprobs)} logprobs for {len(completion)} tokens"
            )
        if record.logprob_temperature != out.logprob_temperature:
            raise ValueError(
                f"step {k}: log-probs taken at temperature {record.logprob_temperature}, "
                f"step 0's at {out.logprob_temperature}"
            )
        prompt = record.prompt_token_ids
        if prompt[: len(out.token_ids)] != out.token_ids:
            raise PrefixBroken(k)
        added = len(prompt) - len(out.token_ids)
        out.loss_mask += [0] * added + [1] * len(completion)
        out.logprobs += [0.0] * added + list(record.logprobs)
        out.spans.append((len(prompt), len(prompt) + len(completion)))
        out.token_ids = [*prompt, *completion]
    return out


class RewardActivities:
    """Activities of the rewards queue; holds the object store they write to."""

    def __init__(self, store: ObjectStore):
        self.store = store

    @activity.defn(name=Activity.WRITE_TRAJECTORIES)
    async def write_trajectories(self, req: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        if not req.samples:
            raise invalid("samples", "no samples to write")
        # each phase reads or writes the whole group: it may outlast the heartbeat timeout
        trajectories = await heartbeating_each(
            list(enumerate(req.samples)),
            lambda item: asyncio.to_thread(self._assemble, req, *item),
            details=lambda: "assembling",
        )
        written = await heartbeating_each(
            list(zip(trajectories, req.samples, strict=True)),
            lambda item: asyncio.to_thread(self._write_once, req.run_id, *item),
            details=lambda: "writing",
        )
        rewards = [sample.reward for sample in req.samples]
        note_rewards(rewards, [sample.solved for sample in req.samples], run_id=req.run_id)
        refs = [ref for ref, _ in written]
        return WriteTrajectoriesResponse(trajectories=refs, created=sum(new for _, new in written))

    def _assemble(
        self, req: WriteTrajectoriesRequest, index: int, episode: EpisodeState
    ) -> Trajectory:
        where = f"samples[{index}]"
        if episode.end is None:
            raise invalid(f"{where}.end", f"sample {episode.sample} never ended")
        if episode.verdict is not None and episode.verdict.status is ExecStatus.INFRA_ERROR:
            raise invalid(f"{where}.verdict", "infra_error is a platform fault, never a reward")
        records = [
            read_model(
                self.store, f"{where}.steps[{k}].completion", step.completion, CompletionRecord
            )
            for k, step in enumerate(episode.steps)
        ]
        try:
            sequence = token_sequence(records)
        except PrefixBroken as exc:
            raise invalid(f"{where}.steps[{exc.step}]", str(exc)) from exc
        except ValueError as exc:
            raise invalid(f"{where}.steps", str(exc)) from exc
        steps = [
            self._step(f"{where}.steps[{k}]", req.task.env, step, record, span)
            for k, (step, record, span) in enumerate(
                zip(episode.steps, records, sequence.spans, strict=True)
            )
        ]
        last = records[-1] if records else None
        return Trajectory(
            id=trajectory_id(req.run_id, req.task.id, episode.sample),
            run_id=req.run_id,
            task_id=req.task.id,
            sample=episode.sample,
            group_size=req.group_size,
            env=req.task.env,
            prompt=req.task.prompt,
            token_ids=sequence.token_ids,
            loss_mask=sequence.loss_mask,
            logprobs=sequence.logprobs,
            logprob_temperature=sequence.logprob_temperature,
            steps=steps,
            end=episode.end,
            reward=episode.reward,
            solved=episode.solved,
            verifier=episode.verdict.result if episode.verdict else None,
            policy_version=last.policy_version if last else 0,
            created_at=(last.finished_at or last.started_at) if last else "",
        )

    def _step(
        self,
        where: str,
        env: EnvName,
        step: EpisodeStep,
        record: CompletionRecord,
        span: tuple[int, int],
    ) -> TrajectoryStep:
        if step.status is ExecStatus.INFRA_ERROR:
            raise invalid(f"{where}.status", "infra_error is a platform fault, never a reward")
        code = None
        if env is EnvName.CODE:
            if step.status is None or step.code is None:
                raise invalid(f"{where}.status", "step was never executed (no status or code)")
            code = read_verified(self.store, f"{where}.code", step.code).decode()
        return TrajectoryStep(
            step=step.step,
            policy_version=step.policy_version,
            span=span,
            completion_text=record.text,
            finish_reason=record.finish_reason,
            code=code,
            call=self._call(where, step, record),
            observation=step.observation,
            status=step.status,
            tests_passed=step.tests_passed,
            tests_total=step.tests_total,
            reward=step.reward if step.reward is not None else 0.0,
            started_at=record.started_at,
            finished_at=record.finished_at,
        )

    @staticmethod
    def _call(where: str, step: EpisodeStep, record: CompletionRecord) -> ToolCall | None:
        """The step's whole call: the workflow holds its brief, the record its text."""
        if step.call is None:
            return None
        try:
            return full_call(step.call, record.text, WORKSPACE_TOOLS, thinking=record.thinking)
        except ValueError as exc:
            raise invalid(f"{where}.call", f"{step.completion.key}: {exc}") from exc

    def _write_once(
        self, run_id: str, trajectory: Trajectory, sample: EpisodeState
    ) -> tuple[ObjectRef, bool]:
        """Create-only write; (ref, True) when new, (ref, False) when already stored (a retry).
        A new one's reward is counted here, as it is stored: the write that stored it is the one
        that counts it (a retry after a sibling's write failed counts what it stores, not what
        the failed attempt stored, nor anything twice)."""
        key = keys.trajectory_key(run_id, trajectory.task_id, trajectory.sample)
        data = trajectory.model_dump_json().encode()
        try:
            ref, new = self.store.put_once(key, data, content_type=JSON)
        except ObjectExists as exc:  # a different trajectory: most often the same run id and
            # task started again (keys name a rollout by them), else a rollout not deterministic
            raise fail(
                ErrorType.STORED_CONFLICT,
                f"{exc}: run {run_id!r} already stored another episode {trajectory.sample} of "
                f"task {trajectory.task_id!r} (started again under the same run id? a run id "
                "names one rollout of a task: use a new one)",
            ) from exc
        if new:
            count_rewards([sample.reward], [sample.solved], run_id=run_id)
        return ref, new
