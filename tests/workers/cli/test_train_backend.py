"""`tempered train` refuses, before the stack and workers start, a run that the inference
backend these settings start would refuse at its first generate, or whose adapters it could not
serve (`check_inputs`, when the workers run here). No server is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.run import TrainingRunInput
from infra.inference.vllm import GUIDED_REFUSAL, TOP_P_REFUSAL
from infra.presets import load_preset
from infra.settings import InferenceSettings, Settings, VLLMSettings
from workers.cli import run
from workers.cli.train_inputs import check_inputs


def vllm(home: Path, **values: object) -> Settings:
    engine = VLLMSettings.model_validate(values)
    return Settings(home=home, inference=InferenceSettings(backend="vllm", vllm=engine))


def run_input(**values: object) -> TrainingRunInput:
    return TrainingRunInput.model_validate({"run_id": "r", "suite": "starter", **values})


def test_a_sampled_top_p_below_1_is_refused_where_vllm_serves_the_run(tmp_path: Path) -> None:
    """vLLM records log-probs after top-p (its backend refuses such rows, TOP_P_REFUSAL), but
    only at the first generate: after the stack, five workers and the run had started."""
    nucleus = run_input(sampling={"temperature": 0.9, "top_p": 0.95})
    with pytest.raises(ValueError) as refused:
        check_inputs(vllm(tmp_path), nucleus, workers_here=True)
    assert TOP_P_REFUSAL.format(top_p=0.95) in str(refused.value)
    sampled_eval = run_input(sampling={"top_p": 1.0}, eval_sampling={"temperature": 0.5})
    with pytest.raises(ValueError, match="eval_sampling.top_p = 0.95"):
        check_inputs(vllm(tmp_path), sampled_eval, workers_here=True)
    greedy_eval = run_input(sampling={"top_p": 1.0})  # eval_sampling: temperature 0, top_p 0.95
    check_inputs(vllm(tmp_path), greedy_eval, workers_here=True)
    check_inputs(Settings(home=tmp_path), nucleus, workers_here=True)  # the local backend
    check_inputs(vllm(tmp_path), nucleus, workers_here=False)  # the workers' settings are theirs


def test_guided_tool_calls_are_refused_where_vllm_serves_the_run(tmp_path: Path) -> None:
    agent = run_input(sampling={"top_p": 1.0, "tool_choice": "required"})
    with pytest.raises(ValueError) as refused:
        check_inputs(vllm(tmp_path), agent, workers_here=True)
    assert GUIDED_REFUSAL in str(refused.value)


def test_lora_the_vllm_engine_cannot_serve_is_refused(tmp_path: Path) -> None:
    """A rank above `inference.vllm.max_lora_rank`, or LoRA with `enable_lora = false`: the
    engine refused the first adapter version, after the run had trained a step."""
    lora = run_input(sampling={"top_p": 1.0}, grpo={"lora_rank": 32})
    with pytest.raises(ValueError, match="grpo.lora_rank = 32 is above inference.vllm.max_lora"):
        check_inputs(vllm(tmp_path, max_lora_rank=16), lora, workers_here=True)
    with pytest.raises(ValueError, match="inference.vllm.enable_lora is false"):
        check_inputs(vllm(tmp_path, enable_lora=False, max_lora_rank=32), lora, workers_here=True)
    check_inputs(vllm(tmp_path, max_lora_rank=32), lora, workers_here=True)
    full = run_input(sampling={"top_p": 1.0})
    check_inputs(vllm(tmp_path, enable_lora=False), full, workers_here=True)


def test_train_and_its_dry_run_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = vllm(tmp_path / "home")
    for dry in (["--dry-run"], []):
        assert run(["train", "--preset", "tiny", *dry], settings) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("tempered train: sampling.top_p = 0.95: vllm backend: ")
    assert not settings.home.exists()  # nothing started
    assert load_preset("tiny").sampling.top_p == 0.95  # what the refusal is about
