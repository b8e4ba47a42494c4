"""What `tempered train --dry-run` prints: the plan of a new run, as JSON, with nothing started.

    print(json.dumps(plan(settings, run_input, workers=not args.no_workers), indent=2))

The plan names the stack `train` would bring up (unless running: Temporal, its UI, S3 and the
bucket, embedded or external), the background workers it would start, the workflow it would
start (type, id, task queue, namespace), where the report would go, and the run's input as
checked (`workers/cli/train_inputs.py`).

Not covered: whether any of it is up or would start; the checks a real run makes once the
stack answers (other runs running, the run id taken: `workers/cli/train.py`).
"""

from __future__ import annotations

from typing import Any

from contracts.names import Queue, Workflow
from contracts.run import TrainingRunInput
from infra import stack
from infra.settings import Settings
from workers.cli.report import report_dir
from workers.training import workflow_id


def plan(settings: Settings, run_input: TrainingRunInput, workers: bool) -> dict[str, Any]:
    """What `train` would do: the stack it brings up (unless running), the background workers
    it starts (unless running), the workflow it starts, where the report goes."""
    s3 = stack.s3_endpoint(settings)
    external = "" if settings.temporal.embedded else " (external)"
    return {
        "stack": {
            "temporal": f"{stack.temporal_endpoint(settings)}{external}",
            "temporal_ui": stack.temporal_ui(settings),
            "s3": f"http://{s3} (embedded)"
            if s3
            else f"{settings.s3.endpoint or 'AWS'} (external)",
            "bucket": settings.s3.bucket,
        },
        "workers": [queue.value for queue in Queue] if workers else [],
        "workflow": {
            "type": Workflow.TRAINING_RUN.value,
            "id": workflow_id(run_input.run_id),
            "task_queue": Queue.AGENT_TASKS.value,
            "namespace": settings.temporal.namespace,
        },
        "report": str(report_dir(settings, run_input.run_id)),
        "input": run_input.model_dump(mode="json"),
    }
