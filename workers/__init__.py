"""Worker processes, one per task queue, and the `tempered` CLI (`workers/cli.py`).

Each queue has a small module (`workers/<queue>.py`) with a `build(settings) -> WorkerPlan`
that imports its heavy dependencies lazily; `workers/runtime.py` runs any plan.
"""
