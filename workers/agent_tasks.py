"""Worker of the `agent-tasks` queue: runs the workflows only (no I/O of its own).

    tempered worker agent-tasks
"""

from contracts.names import Queue
from infra.settings import Settings
from workers.plan import WorkerPlan

QUEUE = Queue.AGENT_TASKS


def build(settings: Settings) -> WorkerPlan:
    from workflows.agent_task import AgentTaskWorkflow
    from workflows.learner import LearnerWorkflow
    from workflows.training_run import TrainingRunWorkflow

    return WorkerPlan(workflows=[AgentTaskWorkflow, LearnerWorkflow, TrainingRunWorkflow])
