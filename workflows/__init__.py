"""Deterministic Temporal workflows: the agent-task FSM, the learner and the training run.

Workflow modules import the standard library, `temporalio`, `contracts` and one another (the
training run composes a dozen `workflows.*` modules), the project's modules and pydantic under
`workflow.unsafe.imports_passed_through()`. None imports `activities`, `infra` or `workers`:
activities are called by name (`contracts.names`), and all I/O happens in them.

A change to the commands a workflow issues goes behind `workflow.patched` (one `*_PATCH` name
each); when such a patch may be retired (`workflow.deprecate_patch`, then removed) is the
README's, "Safe upgrades", In-place changes.
"""
