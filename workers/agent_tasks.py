"""Worker of the `agent-tasks` queue: runs the workflows only (no I/O of its own).

tempered worker agent-tasks
"""

from __future__ import annotations

from infra.settings import Settings
from workers.plan import WorkerPlan
from workflows.agent_task import AgentTaskWorkflow
from workflows.learner import LearnerWorkflow
from workflows.training_run import TrainingRunWorkflow


def build(settings: Settings) -> WorkerPlan:
    return WorkerPlan(workflows=[AgentTaskWorkflow, LearnerWorkflow, TrainingRunWorkflow])
