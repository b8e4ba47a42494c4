"""What a new training run may not start with (`TrainingRunInput.new_run_problem`, asked where a
run is built, `infra.presets.load_preset`): what it could only waste its time on, and values
past what it can use of fields that have no upper bound, and a run id `tempered runs rm` would
take for another run's evaluation.

These are not field bounds because inputs recorded before must still decode: a new bound on an
old field would fail an in-flight run's replay. The learner's own rules are
`GRPOConfig.new_run_problem`'s; what depends on the settings the workers run with (the
inference backend) is `tempered train`'s (`workers/cli/train_inputs.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contracts.names import is_evaluation
from contracts.task import group_steps_problem

if TYPE_CHECKING:
    from contracts.run import TrainingRunInput

MAX_STEPS = 100_000
"""The most learner steps a run has (`TrainingRunInput.steps`), and a new run's `eval_every`."""
MAX_HELDOUT_LIMIT = 100_000
"""The most held-out tasks a new run's evaluations may be limited to."""
MAX_TIME_BUDGET_S = 366 * 86_400
"""The longest time budget of a new run, a year and a day (1e300 s overflowed its deadline)."""
MAX_SEED = 2**63 - 1
"""The largest seed of a new run (a TOML integer's largest)."""


def new_run_problem(run: TrainingRunInput) -> str | None:
    """Why a new run may not start with `run` (None: it may)."""
    if is_evaluation(run.run_id):  # not a field rule: runs stored with such an id must decode
        return (
            f"run_id: {run.run_id!r} has the form of an evaluation's run id (<run>-eval-v<N>): "
            "`tempered runs rm <run>` would take it along; choose another run id"
        )
    if run.seed < 0:  # random.Random seeds with abs(): -1 would draw as 1 does
        return f"seed = {run.seed}: a seed is 0 or more (-{-run.seed} draws as {-run.seed})"
    if run.group_size < 2:  # GRPO's advantage is an episode's reward against its group's
        return (
            f"group_size = {run.group_size}: a group of one episode is always flat (its "
            "advantage is 0), so the run would train nothing; set group_size to 2 or more"
        )
    if problem := group_steps_problem(run.group_size, run.max_turns):  # each task's input's
        return problem  # rule: asked here, the run's tasks would fail in the workflow for ever
    return _over_a_limit(run) or _no_room_to_sample(run) or run.grpo.new_run_problem()


def _over_a_limit(run: TrainingRunInput) -> str | None:
    """A value past what a run can use, of a field that has no upper bound."""
    toml = "the largest integer TOML holds"
    limits: list[tuple[str, float | None, int, str]] = [
        ("eval_every", run.eval_every, MAX_STEPS, "the most steps a run has"),
        ("heldout_limit", run.heldout_limit, MAX_HELDOUT_LIMIT, "past any suite's"),
        ("time_budget_s", run.time_budget_s, MAX_TIME_BUDGET_S, "a year and a day"),
        ("seed", run.seed, MAX_SEED, toml),
        ("sampling.seed", run.sampling.seed, MAX_SEED, toml),
        ("eval_sampling.seed", run.eval_sampling.seed, MAX_SEED, toml),
    ]
    for name, value, most, what in limits:
        if value is not None and value > most:
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            return f"{name} = {shown}: at most {most:,} ({what})"
    return None


def _no_room_to_sample(run: TrainingRunInput) -> str | None:
    """A completion as long as the context budget: a step is taken only while its prompt plus
    `max_new_tokens` fits `max_context_tokens` (activities/inference.py), so every episode would
    end as `context_budget` before its first token."""
    for name, sampling in (("sampling", run.sampling), ("eval_sampling", run.eval_sampling)):
        if sampling.max_new_tokens >= run.max_context_tokens:
            return (
                f"{name}.max_new_tokens = {sampling.max_new_tokens} leaves no room for a prompt "
                f"in max_context_tokens = {run.max_context_tokens}: every episode would end as "
                "context_budget before sampling and the run would train nothing; raise "
                "max_context_tokens above max_new_tokens by a prompt's length at least"
            )
    return None
