"""Deterministic Temporal workflows: the agent-task FSM, the learner and the training run.

Workflow modules import only `contracts` (and `workflows.fsm`), under
`workflow.unsafe.imports_passed_through()`; all I/O happens in activities.
"""
