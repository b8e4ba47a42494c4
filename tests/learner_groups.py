"""GRPO groups for learner tests: one-turn samples with on-policy log-probs of a model.

groups = on_policy_groups(tiny_dir)   # 2 prompts, 4 samples each: rewards 0/1/0/1, 8-20 tokens
"""

from __future__ import annotations

from pathlib import Path

import torch

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra import grpo
from infra.learner_engine import LearnerEngine
from tests.trajectories import Step, trajectory


def on_policy_groups(
    model_dir: Path, tasks: int = 2, samples: int = 4, seed: int = 1
) -> list[list[Trajectory]]:
    """`tasks` groups, each `samples` random completions (8, 12, 16, ... tokens) of one random
    12-token prompt, rewarded by sample parity, with the log-probs `model_dir` gives them."""
    engine = LearnerEngine("cpu")
    engine.load(model_dir, 0, GRPOConfig())
    generator = torch.Generator().manual_seed(seed)
    out = []
    for task in range(tasks):
        group = []
        prompt = torch.randint(3, 259, (12,), generator=generator).tolist()  # one task, one prompt
        for sample in range(samples):
            completion = torch.randint(3, 259, (8 + 4 * sample,), generator=generator).tolist()
            n = len(prompt) + len(completion)
            row = grpo.Row("x", prompt + completion, [0] * n, [0.0] * n, [0.0] * n)
            logprobs = engine.sequence_logprobs(grpo.collate([row], pad_id=0))
            old = logprobs[0, len(prompt) - 1 :].tolist()
            group.append(
                trajectory(
                    [Step(prompt, completion, old)],
                    reward=float(sample % 2),
                    task_id=f"t{task}",
                    sample=sample,
                )
            )
        out.append(group)
    return out
