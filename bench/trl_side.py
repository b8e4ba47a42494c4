"""TRL's side of bench/vs_trl.py: GRPOTrainer on the same model, tasks, reward and sandbox.

Run through `bench/vs_trl.py --side trl` (it needs TRL: `pip install -e '.[bench]'`). Single-turn
(TRL's GRPOTrainer is), one optimizer step per generation, DAPO token normalization over the
groups with a signal as Tempered's (`grpo_trainer`; until 7 December over every group's tokens,
flat ones' too: a smaller step at the same learning rate), the same trainable parameters as
Tempered's learner (`train_last_layers`). Held-out pass@1, as Tempered's run before the first
step, every `eval_every` steps and after the last (until 7 December not after the last with
`--eval-every 0`), is one greedy `generate` per task with Tempered's prompt, scored in the
same sandbox backend, over the held-out tasks Tempered's run evaluates (`heldout_tasks`: the
suite's, quarantined ones left out, `spread` to the run's `heldout_limit`; until 6 December TRL
evaluated them all, 80 against Tempered's 20 with `--preset tiny`). The timeline's clock starts
once torch, transformers, TRL and the datasets are imported, the sandbox pool is up and the model
and trainer are built, right before `train()`: that setup is reported apart (`setup_s`).
Gradient checkpointing is off, as in Tempered's learner: TRL's configs turn it on by default,
which recomputes each forward in the backward pass (more work a step, less memory).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import SandboxPool

from contracts.run import TrainingRunInput, spread
from contracts.task import TaskSpec
from infra.settings import Settings


def suite_tasks(run: TrainingRunInput, settings: Settings) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """The run's training tasks and the held-out tasks it evaluates, as Tempered's run gets them:
    quarantined tasks left out (activities/tasks.py), the held-out ones `spread` to the run's
    `heldout_limit` (workflows/evaluations.py)."""
    from infra.tasks import load_quarantine, load_suite

    skipped = load_quarantine(settings, run.suite)
    kept = [t for t in load_suite(run.suite) if t.id not in skipped]
    train = [t for t in kept if t.split == "train"]
    heldout = [t for t in kept if t.split == "heldout"]
    return train, spread(heldout, run.heldout_limit)


def heldout_tasks(run: TrainingRunInput, settings: Settings) -> list[TaskSpec]:
    return suite_tasks(run, settings)[1]


def greedy_pass_at_1(
    model: Any, tokenizer: Any, tasks: list[TaskSpec], pool: SandboxPool, max_new_tokens: int
) -> float:
    """Held-out pass@1: one greedy completion per task (Tempered's prompt), run by `pool`."""
    import torch

    from contracts.task import EnvName
    from infra.inference.prompts import ChatFormat, extract_code

    chat = ChatFormat(tokenizer, EnvName.CODE)
    rows = [chat.first_prompt(t.prompt) for t in tasks]
    width, pad = max(map(len, rows)), tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            pad_token_id=pad,
            max_new_tokens=max_new_tokens,
        )
    model.train()
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    solved = pool.passed([extract_code(t) for t in texts], tasks)
    return sum(solved) / len(solved)


def eval_due(step: int, run: TrainingRunInput) -> bool:
    """Whether TRL evaluates after `step`: as Tempered's run, every `eval_every` steps and after
    the last whatever `eval_every` (0: the last only; step 0 is evaluated before training)."""
    return step == run.steps or bool(run.eval_every and step % run.eval_every == 0)


def grpo_config(run: TrainingRunInput, seed: int, out_dir: Path) -> Any:
    """TRL's GRPOConfig doing what one Tempered learner step does (on-policy, one generation)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir),
        max_steps=run.steps,
        seed=seed,
        use_cpu=True,
        bf16=False,
        learning_rate=run.grpo.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=run.grpo.max_grad_norm,
        per_device_train_batch_size=run.grpo.groups_per_step * run.group_size,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,  # TRL's default is on; Tempered's learner never recomputes
        num_generations=run.group_size,
        num_iterations=1,
        max_completion_length=run.sampling.max_new_tokens,
        temperature=run.sampling.temperature,
        top_p=run.sampling.top_p,
        beta=run.grpo.kl_coef,
        epsilon=run.grpo.clip_eps,
        loss_type="dapo",
        scale_rewards="group",
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def signal_rows(rewards: list[float], group_size: int) -> list[bool]:
    """Whether each completion's group (`group_size` in a row, as TRL generates them) has a
    GRPO signal: Tempered's rule (`contracts.learner.has_signal`)."""
    from contracts.learner import has_signal

    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return [has_signal(group) for group in groups for _ in group]


def grpo_trainer() -> type:
    """TRL's GRPOTrainer normalizing its `dapo` loss as Tempered's learner does without a KL term
    (infra/grpo_plan.py `plan_step`): a flat group has no gradient, so its tokens are not
    counted and its advantages are 0 (not round-off over 1e-4). TRL divides by every completion
    token of the generation batch (`num_items_in_batch`), flat groups' too: its step was smaller
    by their share (half of them with smollm2) at the same learning rate."""
    import torch
    from trl import GRPOTrainer

    class SignalTokensGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def _calculate_rewards(self, inputs: Any, *args: Any) -> Any:
            self._rewards = super()._calculate_rewards(inputs, *args)  # every process's rows
            return self._rewards

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            if self.beta != 0.0:  # a KL term: every group has a gradient, as in Tempered
                return out
            rewards = (self._rewards * self.reward_weights.to(self._rewards.device)).nansum(dim=1)
            size = self.num_generations
            assert size is not None  # training: GRPOConfig.num_generations, the run's G
            signal = signal_rows(rewards.tolist(), size)
            rows = len(out["advantages"])
            first = self.accelerator.process_index * rows  # this process's rows (TRL's slice)
            kept = torch.tensor(signal[first : first + rows], device=out["advantages"].device)
            out["advantages"] = out["advantages"] * kept
            mask = out["completion_mask"] * out.get("tool_mask", 1)
            tokens = (mask.sum(dim=1) * kept).sum()
            out["num_items_in_batch"] = self.accelerator.gather(tokens).sum()
            return out

    return SignalTokensGRPOTrainer


def trl_side(
    settings: Settings, run: TrainingRunInput, base_dir: Path, seed: int, timeline: Any, out: Path
) -> None:
    """Train with TRL's GRPOTrainer, telling `timeline` (vs_trl.Timeline) each step and eval;
    its clock starts once everything is imported, loaded and built."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from infra.inference.prompts import extract_code, task_messages
    from infra.learner_model import train_only_last_layers

    pool = SandboxPool(settings, run.limits)
    train, heldout = suite_tasks(run, settings)
    by_id = {t.id: t for t in train}

    def sandbox_reward(completions: list[Any], task_id: list[str], **_: Any) -> list[float | None]:
        codes = [extract_code(c[0]["content"] if isinstance(c, list) else c) for c in completions]
        solved = pool.passed(codes, [by_id[i] for i in task_id])
        return [run.reward.score([ok]) for ok in solved]  # one turn: 1.0 or -0.1

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    train_only_last_layers(model, run.grpo.train_last_layers)  # the parameters Tempered trains
    tokenizer = AutoTokenizer.from_pretrained(base_dir)

    def evaluate(step: int) -> None:
        """Held-out pass@1, greedy; training waits for it (the timeline nets it out)."""
        tokens, began = run.eval_sampling.max_new_tokens, time.perf_counter()
        pass_at_1 = greedy_pass_at_1(model, tokenizer, heldout, pool, tokens)
        timeline.evaluated(step, pass_at_1, len(heldout), stopped_s=time.perf_counter() - began)

    class HeldoutEval(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            evaluate(0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            timeline.stepped(step)
            if eval_due(step, run):
                evaluate(step)
            control.should_training_stop |= timeline.target_s is not None

    rows = [{"prompt": task_messages(t.prompt), "task_id": t.id} for t in train]
    trainer = grpo_trainer()(
        model=model,
        reward_funcs=sandbox_reward,
        args=grpo_config(run, seed, out),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[HeldoutEval()],
    )
    try:
        timeline.start()  # after the imports, the pool, the model and the trainer (setup_s)
        trainer.train()
        timeline.finish()  # before the pool closes, as Tempered's before its workers stop
    finally:
        pool.close()
