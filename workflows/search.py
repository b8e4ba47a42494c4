"""Typed search-attribute keys for Tempered's custom attributes (registered by `tempered up`),
and what an agent task is started with so it is described from its first event."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

with workflow.unsafe.imports_passed_through():
    from contracts.names import SEARCH_ATTRIBUTE_TYPES, SearchAttr
    from contracts.task import AgentTaskInput

_KEY_FACTORIES: dict[str, Callable[[str], SearchAttributeKey[Any]]] = {
    "Keyword": SearchAttributeKey.for_keyword,
    "Int": SearchAttributeKey.for_int,
    "Double": SearchAttributeKey.for_float,
}

KEYS: dict[SearchAttr, SearchAttributeKey[Any]] = {
    attr: _KEY_FACTORIES[kind](attr.value) for attr, kind in SEARCH_ATTRIBUTE_TYPES.items()
}


def search_attribute_updates(values: dict[SearchAttr, Any]) -> list[SearchAttributeUpdate[Any]]:
    """Updates for `workflow.upsert_search_attributes`; None values are left unset."""
    return [KEYS[attr].value_set(value) for attr, value in values.items() if value is not None]


def task_memo(task_input: AgentTaskInput) -> dict[str, Any]:
    """What an agent task's memo shows in the UI's list (set on its start, or by the task)."""
    task = task_input.task
    return {
        "task": task.id,
        "suite": task.suite,
        "prompt": task.prompt[:200],
        "group_size": task_input.group_size,
        "max_turns": task_input.max_turns,
    }


def task_start_options(task_input: AgentTaskInput) -> dict[str, Any]:
    """Keyword arguments for starting an `AgentTaskWorkflow` (as a child or from a client): its
    memo and its constant search attributes (run, task) ride on the start event, so visibility
    knows them from the start and the workflow need not upsert them (a write each)."""
    task = task_input.task
    return {
        "memo": task_memo(task_input),
        "search_attributes": TypedSearchAttributes(
            [
                SearchAttributePair(KEYS[SearchAttr.RUN_ID], task_input.run_id),
                SearchAttributePair(KEYS[SearchAttr.TASK_ID], task.id),
            ]
        ),
    }
