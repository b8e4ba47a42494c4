"""`TrainingRunInput` as a user writes it (a preset, `--set`-style overrides): every field says
what it is, NaN and infinity are refused by name, and what a new run could only waste its time
on is refused by `new_run_problem` (asked by `load_preset`), while a stored input that has it (a
run of an earlier release, whose history replays) still decodes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from contracts.learner import GRPOConfig, HistoryBudget
from contracts.run import TrainingRunInput
from contracts.task import AgentTaskInput, RewardConfig, SamplingParams, SandboxLimits
from infra.presets import load_preset

INPUTS: tuple[type[BaseModel], ...] = (
    TrainingRunInput,
    SamplingParams,
    RewardConfig,
    SandboxLimits,
    GRPOConfig,
    HistoryBudget,
    AgentTaskInput,
)
"""The models a user writes values of: a run's input and what it holds, and a task's input."""


@pytest.mark.parametrize("model", [TrainingRunInput, SamplingParams], ids=lambda m: m.__name__)
def test_every_field_says_what_it_is(model: type[BaseModel]) -> None:
    """`run_id`, `steps`, `sampling`, `top_p`, `max_new_tokens` and others had no description:
    `--dry-run`'s JSON and the docs showed a bare name."""
    bare = [name for name, field in model.model_fields.items() if not field.description]
    assert bare == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan"])
def test_nan_and_infinity_are_refused_by_name_in_a_runs_input(value: object) -> None:
    """`temperature = nan` in a preset said "should be less than or equal to 2"."""
    with pytest.raises(ValidationError, match="finite number") as refused:
        TrainingRunInput.model_validate({"run_id": "r", "sampling": {"temperature": value}})
    assert refused.value.errors()[0]["loc"] == ("sampling", "temperature")


def test_every_float_of_an_input_model_must_be_finite() -> None:
    for model in INPUTS:
        assert model.model_config.get("allow_inf_nan") is False, model.__name__


def test_a_nan_in_a_preset_names_the_field(tmp_path: Path) -> None:
    preset = tmp_path / "nan.toml"
    preset.write_text("[sampling]\ntemperature = nan\n")
    with pytest.raises(ValueError, match=r"sampling\.temperature: Input should be a finite"):
        load_preset(str(preset), run_id="r")


def new_problem(**values: object) -> str:
    return TrainingRunInput.model_validate({"run_id": "r", **values}).new_run_problem() or ""


@pytest.mark.parametrize("which", ["sampling", "eval_sampling"])
def test_a_completion_as_long_as_the_context_is_refused(which: str) -> None:
    """`max_new_tokens >= max_context_tokens`: every step's prompt plus its completion would pass
    the budget, so every episode ended as `context_budget` before sampling (activities/
    inference.py) and the run trained nothing."""
    short = {"sampling": {"max_new_tokens": 64}, "eval_sampling": {"max_new_tokens": 64}}
    long = short | {which: {"max_new_tokens": 128}}
    problem = new_problem(max_context_tokens=128, **long)
    assert problem.startswith(f"{which}.max_new_tokens = 128 leaves no room for a prompt")
    assert "max_context_tokens = 128" in problem
    assert new_problem(max_context_tokens=129, **long) == ""
    stored = TrainingRunInput.model_validate(
        {"run_id": "r", "max_context_tokens": 64, which: {"max_new_tokens": 100}}
    )
    assert TrainingRunInput.model_validate_json(stored.model_dump_json()) == stored


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"eval_every": 100_001}, "eval_every = 100001"),
        ({"heldout_limit": 100_001}, "heldout_limit = 100001"),
        ({"time_budget_s": 1e12}, "time_budget_s = 1e+12"),
        ({"seed": 2**63}, f"seed = {2**63}"),
        ({"sampling": {"seed": 2**63}}, f"sampling.seed = {2**63}"),
        ({"eval_sampling": {"seed": 2**63}}, f"eval_sampling.seed = {2**63}"),
    ],
)
def test_values_past_what_a_run_can_use_are_a_new_runs_problem(
    values: dict[str, object], named: str
) -> None:
    """No upper bound on the field (a stored run's input must still decode: a new bound on an
    old field can refuse an in-flight run's history), so a new run is refused here instead: a
    time budget of 1e300 s overflowed the run's deadline."""
    assert new_problem(**values).startswith(named)
    stored = TrainingRunInput.model_validate({"run_id": "r", **values})
    assert TrainingRunInput.model_validate_json(stored.model_dump_json()) == stored


def test_a_group_past_a_tasks_history_bound_is_a_new_runs_problem() -> None:
    """G × max_turns past `MAX_GROUP_STEPS`: every task's `AgentTaskInput` is refused, which the
    training run builds in its workflow code, so its workflow task failed for ever."""
    assert new_problem(group_size=128, max_turns=20).startswith(
        "group_size × max_turns = 128 × 20 = 2,560 episode-steps: at most 768"
    )
    assert new_problem(group_size=8, max_turns=50) == ""
