"""Preset files (infra/presets): a file's mistake is told in one line that says how to fix it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from infra.presets import load_preset
from infra.settings import InferenceSettings, Settings
from tests.paths import REPO_ROOT
from workers.cli.train_inputs import backend_problem


def test_a_misspelt_key_in_a_preset_file_names_the_key_meant(tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text('suite = "starter"\nbase_model = "tiny"\n[sampling]\ntemprature = 0.7\n')
    with pytest.raises(
        ValueError, match=r"sampling\.temprature: .*did you mean sampling\.temperature"
    ):
        load_preset(str(preset))


def test_a_preset_file_extends_a_preset_table_by_table(tmp_path: Path) -> None:
    """A file holding only `[sampling] top_p = 1.0` (what the vllm backend's refusal asked for)
    ran the tiny model for 3 steps: what a file does not say comes from TrainingRunInput's own
    defaults. `extends` names the preset it starts from; its tables merge key by key."""
    mine = tmp_path / "vllm.toml"
    mine.write_text('extends = "smollm2"\n[sampling]\ntop_p = 1.0\n')
    run, default = load_preset(str(mine)), load_preset("smollm2")
    assert run.sampling == default.sampling.model_copy(update={"top_p": 1.0})
    changed = {"run_id", "sampling"}
    assert run.model_dump(exclude=changed) == default.model_dump(exclude=changed)
    alone = tmp_path / "alone.toml"  # without `extends`: the contract's defaults, as before
    alone.write_text("[sampling]\ntop_p = 1.0\n")
    assert (load_preset(str(alone)).base_model, load_preset(str(alone)).steps) == ("tiny", 3)

    (tmp_path / "sub").mkdir()
    longer = tmp_path / "sub" / "longer.toml"  # a path is read beside the file that names it
    longer.write_text('extends = "../vllm.toml"\nsteps = 14\n[grpo]\nlearning_rate = 1e-5\n')
    run = load_preset(str(longer))
    assert (run.steps, run.sampling.top_p, run.base_model) == (14, 1.0, "smollm2")
    assert (run.grpo.learning_rate, run.grpo.train_last_layers) == (1e-5, 6)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('extends = "nope"', "extends: unknown preset 'nope' (known: "),
        ('extends = "gone.toml"', "extends: preset file {dir}/gone.toml does not exist"),
        ("extends = 3", "extends: 3 is not a preset name or a .toml path"),
        ('extends = "mine.toml"', "extends: {dir}/mine.toml again (a cycle)"),
    ],
)
def test_an_extends_that_names_no_preset_is_one_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(text + "\n")
    with pytest.raises(ValueError) as refused:
        load_preset(str(mine))
    assert str(refused.value).startswith(f"{mine}: {problem.format(dir=tmp_path)}")


def test_an_override_no_run_could_take_is_blamed_on_itself(tmp_path: Path) -> None:
    """`tempered train --steps 0` said "preset smollm2: steps: …", sending the reader to a
    preset that was fine; a value only the preset and the override together make wrong is the
    preset's to tell."""
    flags = {"steps": "--steps", "time_budget_s": "--time-budget"}
    with pytest.raises(ValueError) as refused:
        load_preset("smollm2", given_as=flags, steps=0)
    assert str(refused.value) == "--steps 0: steps: Input should be greater than or equal to 1"
    with pytest.raises(ValueError) as refused:
        load_preset("smollm2", given_as=flags, time_budget_s=1e300)
    assert str(refused.value).startswith("--time-budget 1e+300: time_budget_s = 1e+300: at most")
    with pytest.raises(ValueError, match=r"^override seed -1: seed = -1: a seed is 0 or more"):
        load_preset("smollm2", given_as=flags, seed=-1)
    broken = tmp_path / "broken.toml"
    broken.write_text("steps = 0\n")
    with pytest.raises(ValueError, match=rf"^{broken}: steps: Input should be greater"):
        load_preset(str(broken), given_as=flags, seed=1)


def test_the_readmes_vllm_preset_is_one_the_vllm_backend_serves(tmp_path: Path) -> None:
    """The README's file for `inference.backend = "vllm"`: the default run, top-p 1."""
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index("    # vllm.toml") :].split("\n\n")[0]
    preset = tmp_path / "vllm.toml"
    preset.write_text(textwrap.dedent(block))
    run, default = load_preset(str(preset)), load_preset("smollm2")
    assert run.model_dump(exclude={"run_id", "sampling"}) == default.model_dump(
        exclude={"run_id", "sampling"}
    )
    vllm = Settings(inference=InferenceSettings(backend="vllm"))
    assert backend_problem(vllm, default) is not None and backend_problem(vllm, run) is None
