"""Scripted model turns for tests: a tool call written exactly as the model is asked to write
it (`infra.inference.toolcalls`: Hermes tags around JSON), for turns no model sampled."""

from __future__ import annotations

import json

from contracts.episode import ToolCall
from infra.inference.toolcalls import CALL_CLOSE, CALL_OPEN


def render_tool_call(call: ToolCall) -> str:
    """The text of `call` in the format the model is asked to write."""
    body = json.dumps({"name": call.name, "arguments": call.arguments})
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"
