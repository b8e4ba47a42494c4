"""Typed search-attribute keys for Tempered's custom attributes (registered by `tempered up`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributeUpdate,
)

with workflow.unsafe.imports_passed_through():
    from contracts.names import SEARCH_ATTRIBUTE_TYPES, SearchAttr

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
