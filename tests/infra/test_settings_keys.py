"""A key that names no field is refused with the field it resembles, from every source (a TOML
file, a `TEMPERED_` variable at any depth, a section set whole as JSON, a preset), and a bad
value names where it came from: the variable, or the settings file.

Before, a misspelt key in a TOML file or after a variable's `__` was only "sandbox.concurency:
Extra inputs are not permitted", and a bad value did not say which of the file and the
environment held it.

Every test runs in an empty working directory with no `TEMPERED_*` variables set.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.run import TrainingRunInput
from infra.settings import Settings
from infra.settings_env import closest_field, describe_invalid
from tests.fixtures.settings_env import refusal

pytestmark = pytest.mark.usefixtures("clean")  # tests/fixtures/settings_env.py


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[sandbox]\nconcurency = 4\n", "sandbox.concurency: Extra inputs are not permitted "
         "(did you mean sandbox.concurrency?)"),
        ("[sandbx]\nconcurrency = 4\n", "sandbx: Extra inputs are not permitted (did you mean "
         "sandbox?)"),
        ("[temporal]\nui_prot = 1\n", "temporal.ui_prot: Extra inputs are not permitted (did "
         "you mean temporal.ui_port?)"),
        ("[sandbox.workspaces]\ndsik = 'tmpfs'\n", "sandbox.workspaces.dsik: Extra inputs are "
         "not permitted (did you mean sandbox.workspaces.disk?)"),
        ("bucket = 'x'\n", "bucket: Extra inputs are not permitted (did you mean s3.bucket?)"),
        ("[tool.black]\nline-length = 99\n", "tool: Extra inputs are not permitted (settings"),
    ],
)  # fmt: skip
def test_a_misspelt_key_in_a_settings_file_names_the_field_meant(
    clean: Path, text: str, expected: str
) -> None:
    config = clean / "my.toml"
    config.write_text(text)
    message = refusal(config)
    assert message.startswith(expected), message
    assert message.endswith(f"(settings file {config})"), message


def test_a_misspelt_nested_variable_names_the_variable_meant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEMPERED_SANDBOX__CONCURENCY", "4")
    monkeypatch.setenv("TEMPERED_SANDBOX__WORKSPACES__TTL", "60")
    assert refusal() == (
        "environment variable TEMPERED_SANDBOX__CONCURENCY names no setting (did you mean "
        "TEMPERED_SANDBOX__CONCURRENCY?); environment variable TEMPERED_SANDBOX__WORKSPACES__TTL "
        "names no setting (did you mean TEMPERED_SANDBOX__WORKSPACES__TTL_S?)"
    )


def test_a_misspelt_key_in_a_section_set_whole_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEMPERED_SANDBOX", '{"concurency": 4}')
    assert refusal() == (
        "sandbox.concurency: Extra inputs are not permitted (did you mean sandbox.concurrency?) "
        "(environment variable TEMPERED_SANDBOX)"
    )


def test_a_bad_value_names_its_source(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = clean / "my.toml"
    config.write_text('[sandbox]\nconcurrency = "four"\n[learner]\ndevice = "cuda:1"\n')
    from_file = refusal(config)
    assert from_file.startswith("sandbox.concurrency: Input should be a valid integer"), from_file
    assert from_file.endswith(f"integer (settings file {config})"), from_file
    monkeypatch.setenv("TEMPERED_SANDBOX__CONCURRENCY", "0")  # the variable outranks the file
    monkeypatch.setenv("TEMPERED_LEARNER__RANKS", "2")  # with the file's device: one fault
    assert refusal(config) == (
        "sandbox.concurrency: Input should be greater than or equal to 1 (environment variable "
        "TEMPERED_SANDBOX__CONCURRENCY); learner: Value error, device 'cuda:1' with ranks = 2: "
        "rank r takes cuda:r; set device to 'cuda' and choose the GPUs with "
        f"CUDA_VISIBLE_DEVICES (environment variable TEMPERED_LEARNER__RANKS and settings file "
        f"{config})"
    )
    # an argument outranks both, and its caller knows it gave it
    given = refusal(config, sandbox={"concurrency": -1}, learner={"ranks": 1, "device": "gpu"})
    assert given == (
        "sandbox.concurrency: Input should be greater than or equal to 1; learner.device: "
        "String should match pattern '^(cpu|cuda|mps|xpu)(:\\d+)?$'"
    )


def test_the_one_helper_serves_any_model_such_as_a_presets() -> None:
    """A preset's `grup_size` was "grup_size: Extra inputs are not permitted"."""
    values = {"run_id": "r", "grup_size": 4, "grpo": {"learning_rat": 1e-4}, "zzz": 1}
    with pytest.raises(ValidationError) as caught:
        TrainingRunInput.model_validate(values)
    assert describe_invalid(caught.value, TrainingRunInput) == (
        "grpo.learning_rat: Extra inputs are not permitted (did you mean grpo.learning_rate?); "
        "grup_size: Extra inputs are not permitted (did you mean group_size?); "
        "zzz: Extra inputs are not permitted"
    )
    assert closest_field(Settings, ["sandbox", "concurency"]) == ("sandbox", "concurrency")
    assert closest_field(Settings, ["threads"]) is None  # several sections have one
