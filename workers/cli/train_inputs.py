"""What `tempered train` checks of a new run before anything starts (`workers/cli/train.py`):
its home, base model and suite, that the preset's sampling fits the suite's tasks, what the
inference backend could not serve, and that its run id is new. What depends on the run's input
alone is `TrainingRunInput.new_run_problem`'s.

    check_inputs(settings, run_input, workers_here=True)   # ValueError: home, model, suite…
    sampling_env(SamplingParams(tool_choice="required"))   # EnvName.WORKSPACE (None: either)
    check_run_id(store, "exp1")                            # RunIdTaken: stored or removed
    why = check_run_id_if_up(settings, "exp1")             # `--dry-run`: None once checked

Sampling fits one env or both (`sampling_env`): a code-block stop is the `code` env's (its
action is a code block), a tool-call stop or a turn forced to a tool call the `workspace` env's
(a `code` task has no tools: inference refuses `tool_choice = "required"` for it). The default
preset on a workspace suite made no valid tool call (SmolLM2 unguided: 0 of 24), every group
flat, nothing learned; `--preset agent` on code tasks failed at its first generate. Both are
refused here, naming the preset that fits; on a suite of several envs (code and workspace tasks
in one JSONL) the presets whose sampling fits every env (`tiny`) and the settings to drop (each
env's preset named the other's: a ping-pong). `tempered eval` refuses the same misfit of its
eval sampling (`sampling_misfit`, with a way out of its own).

A run id is taken when objects are stored under `runs/<id>/` (a finished or failed run, or one
in progress, which `--attach` follows) or `tempered runs rm` removed it (`removed/<id>.json`;
`infra.run_ids` says both). Whether its workflow runs is Temporal's to say, when the run starts.
Paths the workers read are made absolute here (`absolute`): they run in the stack's home.
"""

from __future__ import annotations

from pathlib import Path

from contracts.run import TrainingRunInput
from contracts.task import EnvName, SamplingParams, TaskSpec
from infra import keys, stack
from infra.base_models import SMOLLM2, TINY, check_base_model
from infra.inference.vllm_rows import refusal
from infra.presets import load_preset, preset_names
from infra.run_ids import removal_record, run_stored
from infra.settings import Settings
from infra.storage import ObjectStore, StorageError
from infra.tasks import absolute_suite, load_quarantine, load_suite


class RunIdTaken(ValueError):
    """A new run's `--run-id` that names a run already, and why."""

    def __init__(self, run: str, why: str):
        super().__init__(f"run id {run!r} is taken ({why}); choose another --run-id")


def absolute(spec: str | None) -> str | None:
    """A model directory, suite file or `harbor:DIR` named relative to here, made absolute: the
    workers that read it run in the stack's home (a relative path failed there, after the dry
    run had passed). Presets, built-in suites, s3:// prefixes and what is not here stay as
    they are, and so does an empty one (not the working directory: it is refused by name)."""
    if spec is None or not spec.strip() or spec in (TINY, SMOLLM2):
        return spec
    made = absolute_suite(spec)  # a model directory is spelled as a suite file is
    return made if Path(made.removeprefix("harbor:")).exists() else spec


def check_inputs(settings: Settings, run_input: TrainingRunInput, workers_here: bool) -> None:
    """ValueError for a home, base model or suite the run could not use, or a run the inference
    backend could not serve (`backend_problem`), before anything starts. The workers read the
    model and suite: with `--no-workers` they may run elsewhere, so a path that is not here is
    theirs to read (as `absolute` leaves it), and only what this machine can see is checked;
    names (presets, built-in suites) always are. The backend is theirs too, with their settings."""
    stack.check_home(settings)

    def theirs(spec: str) -> bool:  # a path (not a name) this machine does not have
        path = spec.removeprefix("harbor:")
        return ("/" in path or path.endswith(".jsonl")) and not Path(path).expanduser().exists()

    if workers_here or not theirs(run_input.base_model):
        check_base_model(run_input.base_model)
    if workers_here and (problem := backend_problem(settings, run_input)):
        raise ValueError(problem)
    if workers_here or not theirs(run_input.suite):  # last: a Harbor suite's files are read
        check_suite(settings, run_input)


def backend_problem(settings: Settings, run_input: TrainingRunInput) -> str | None:
    """Why the inference backend of `settings` could not serve the run (None: it could): the
    `vllm` backend refuses a sampled row with top-p < 1 and a guided tool call (its own
    `refusal`, asked here of the run's sampling), at the first generate, after the stack and
    five workers had started; and it serves LoRA adapters only with `enable_lora` and up to
    `max_lora_rank` (a run's first adapter version failed, after its first step). Only where
    the workers run here: elsewhere they have settings of their own."""
    if settings.inference.backend != "vllm":
        return None
    for name in ("sampling", "eval_sampling"):
        params: SamplingParams = getattr(run_input, name)
        if (refused := refusal(params)) is not None:
            field, message = refused
            return f"{name}.{field}: {message}"
    rank, engine = run_input.grpo.lora_rank, settings.inference.vllm
    if rank and not engine.enable_lora:
        return (
            f"grpo.lora_rank = {rank} trains LoRA adapters, but inference.vllm.enable_lora is "
            "false: the vllm backend would refuse every version after v0; set "
            "TEMPERED_INFERENCE__VLLM__ENABLE_LORA=true, or grpo.lora_rank = 0"
        )
    if rank > engine.max_lora_rank:
        return (
            f"grpo.lora_rank = {rank} is above inference.vllm.max_lora_rank = "
            f"{engine.max_lora_rank}, the largest rank the vllm engine serves; set "
            f"TEMPERED_INFERENCE__VLLM__MAX_LORA_RANK to {rank} or more, or a lower lora_rank"
        )
    return None


def check_run_id(store: ObjectStore, run: str) -> None:
    """RunIdTaken if the store knows run `run`: `tempered runs rm` removed it (prepare_run
    refuses the id: workers may still cache its policies under it), or objects of it are stored
    (a rerun of the same command passed prepare_run's create-only write of an identical
    run.json, then met the old run's trajectories and acks). Both were found only after the
    stack, five workers and the workflow had started; a run in progress is `--attach`ed to."""
    removed = removal_record(store, run)
    if removed is not None:
        where = f"s3://{store.bucket}/{removed.key}"
        raise RunIdTaken(run, f"`tempered runs rm` removed a run with it: {where}")
    if run_stored(store, run):
        prefix = keys.run_prefix(run)
        follow = f"`tempered train --attach {run}` follows it while it runs"
        raise RunIdTaken(
            run, f"a run with it is stored under s3://{store.bucket}/{prefix}; {follow}"
        )


def check_run_id_if_up(settings: Settings, run: str) -> str | None:
    """`check_run_id` for `--dry-run`, which starts no stack: where S3 answers at the first try;
    else why not (None: checked)."""
    try:
        store = ObjectStore(settings.s3.model_copy(update={"max_attempts": 1}))
        store.check()
        check_run_id(store, run)
    except StorageError as exc:
        return str(exc)
    return None


def check_suite(settings: Settings, run_input: TrainingRunInput) -> None:
    """ValueError unless the run's suite loads and leaves training tasks once quarantined ones
    are skipped, as the run's first activity needs (activities/tasks.py), and its sampling fits
    them (and its eval sampling the held-out ones: `sampling_misfit`): a missing or malformed
    suite passed `--dry-run`, and a real run failed only after the stack and five workers had
    started and the workflow had begun."""
    suite = run_input.suite
    skipped = load_quarantine(settings, suite)
    tasks = load_suite(suite)  # once: a Harbor suite reads every task's files
    train = [task for task in tasks if task.split == "train" and task.id not in skipped]
    if not train:
        left = f" left ({len(skipped)} quarantined by `tempered tasks validate`)" if skipped else ""
        raise ValueError(f"suite {suite!r} has no training tasks{left}")
    heldout = [task for task in tasks if task.split == "heldout"]
    for name, chosen in (("sampling", train), ("eval_sampling", heldout)):
        if problem := sampling_misfit(getattr(run_input, name), name, suite, chosen):
            raise ValueError(problem)


def sampling_env(params: SamplingParams) -> EnvName | None:
    """The env whose tasks a turn sampled with `params` fits, None where it fits both: a turn
    forced to a tool call (`tool_choice = "required"`) or stopped at its first `</tool_call>`
    is a `workspace` turn (a `code` task has no tools), one stopped at its first closed ```
    block a `code` turn (a `workspace` turn is a tool call, not a code block)."""
    bound = _bound(params)
    return bound[0][0] if bound else None


def _bound(params: SamplingParams) -> list[tuple[EnvName, str]]:
    """The settings of `params` that bind a turn to one env, each with its env; the first
    decides `sampling_env`."""
    settings = [
        (params.tool_choice == "required", EnvName.WORKSPACE, "tool_choice = 'required'"),
        (params.stop_after_tool_call, EnvName.WORKSPACE, "stop_after_tool_call"),
        (params.stop_after_code_block, EnvName.CODE, "stop_after_code_block"),
    ]
    return [(env, setting) for chosen, env, setting in settings if chosen]


WHY = {
    "tool_choice = 'required'": "every turn a tool call",
    "stop_after_code_block": "a turn ends at its first code block defining a function",
}
"""What a deciding setting does to a turn, where its name does not say."""


def sampling_misfit(
    params: SamplingParams,
    name: str,
    suite: str,
    tasks: list[TaskSpec],
    *,
    whose: str = "the preset's",
    way_out: str | None = None,
) -> str | None:
    """Why sampling `params` (`whose` field `name`) does not fit `tasks` of `suite`; None where
    it fits. The way out is `way_out`, else the shipped presets whose sampling fits every env
    of `tasks` (on a suite of several envs: those bound to none, as `tiny`) or a preset TOML
    without the settings that bind it. No flag overrides it: a preset TOML whose `[name]` fits
    is the way to another choice (for `tempered eval`, a run's settings: its `way_out`)."""
    bound = _bound(params)
    envs = sorted({task.env for task in tasks})
    if not bound or not envs or envs == [bound[0][0]]:
        return None
    env, setting = bound[0]
    does = f"{setting}: {WHY[setting]}" if setting in WHY else setting
    if len(envs) == 1:
        has, fit = f"{envs[0]} tasks", envs[0]
        toml = f"a preset TOML whose [{name}] fits them"
    else:
        has, fit = f"{' and '.join(envs)} tasks (several envs)", None
        drop = " and ".join(setting for _, setting in bound)
        toml = f"a preset TOML whose [{name}] fits every env: without {drop}"
    if way_out is None:
        fitting = [f"--preset {preset}" for preset in preset_names() if _preset_env(preset) == fit]
        which = " (its sampling fits every env)" if fit is None and fitting else ""
        way_out = f"use {' or '.join(fitting)}{which}, or {toml}" if fitting else f"use {toml}"
    return (
        f"suite {suite!r} has {has}, but {whose} {name} is for {env} tasks only ({does}): "
        f"{way_out} (no flag overrides this)"
    )


def _preset_env(preset: str) -> EnvName | None:
    """The env the shipped preset `preset`'s training sampling is made for (None: both)."""
    return sampling_env(load_preset(preset).sampling)
