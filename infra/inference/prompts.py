"""Chat prompts of a sample's turn, and the code extracted from a completion.

    messages = build_messages(task_prompt, [(completion_text, execution_result), ...])
    prompt_ids = encode_messages(tokenizer, messages)   # stored verbatim in CompletionRecord
    code = extract_code(completion_text)

A turn's conversation is: system (answer with one ```python block defining the function), user
(the task prompt), then for every earlier turn the assistant's completion text and a user
message with feedback from its execution (status, tests passed/total, the tail of stderr and
stdout, at most `FEEDBACK_CHARS` characters) asking for a fix. The tokenizer's own chat template
renders it, with the generation prompt appended; those ids are what the model is fed and what
the learner trains on, so nothing is ever re-tokenized.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from contracts.sandbox import ExecStatus, ExecutionResult

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the task by writing the requested function. "
    "Answer with exactly one ```python code block that defines the function (and any imports "
    "or helpers it needs); do not include tests, example usage or input() calls."
)
FEEDBACK_CHARS = 1500
"""Most characters of program output quoted back in one feedback message."""

_STATUS_TEXT = {
    ExecStatus.PASSED: "All tests passed.",
    ExecStatus.FAILED: "Your code ran but failed the tests.",
    ExecStatus.ERROR: "Your code raised an error.",
    ExecStatus.TIMEOUT: "Your code exceeded the time limit.",
    ExecStatus.MEMORY_EXCEEDED: "Your code exceeded the memory limit.",
    ExecStatus.INFRA_ERROR: "Your code could not be run because of a platform error.",
}

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}


def _tail(text: str, limit: int) -> str:
    text = text.rstrip()
    if limit <= 0 or not text:
        return ""
    return text if len(text) <= limit else "..." + text[-limit:]


def feedback_text(result: ExecutionResult, max_chars: int = FEEDBACK_CHARS) -> str:
    """The user message reporting one execution: status, tests, output tails, a request to fix."""
    lines = [f"{_STATUS_TEXT[result.status]} (status: {result.status.value})"]
    if result.tests_total:
        lines.append(f"Tests passed: {result.tests_passed}/{result.tests_total}.")
    if result.status is ExecStatus.TIMEOUT:
        lines.append(f"Time limit: {result.limits.timeout_s:g} s.")
    elif result.status is ExecStatus.MEMORY_EXCEEDED:
        lines.append(f"Memory limit: {result.limits.memory_mb} MB.")
    stderr = _tail(result.stderr, max_chars)
    stdout = _tail(result.stdout, max_chars - len(stderr))
    for name, tail in (("stderr", stderr), ("stdout", stdout)):
        if tail:
            lines.append(f"{name} (last {len(tail)} characters):\n```\n{tail}\n```")
    lines.append(
        "Fix the code and answer again with one ```python code block defining the function."
    )
    return "\n".join(lines)


def build_messages(
    prompt: str, history: Sequence[tuple[str, ExecutionResult]] = ()
) -> list[dict[str, str]]:
    """System + task prompt, then (completion, feedback) for every earlier turn, oldest first."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    for completion_text, result in history:
        messages.append({"role": "assistant", "content": completion_text})
        messages.append({"role": "user", "content": feedback_text(result)})
    return messages


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, generation prompt appended."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the policy's tokenizer has no chat template")
    ids = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return [int(t) for t in ids]


def extract_code(text: str) -> str:
    """The program in a completion.

    Fenced blocks tagged python/py/python3 or untagged count (an unterminated block, cut by
    max_new_tokens, runs to the end). The last such block that defines a function wins, since
    models put examples before and refinements after; else the last such block; else, with no
    fence at all, the whole text (a model that answers with bare code still gets run); with
    fences of other languages only, an empty program.
    """
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_TAGS]
    if not blocks:
        return text.strip() + "\n" if "```" not in text else ""
    defining = [b for b in blocks if re.search(r"^\s*(async\s+)?def\s", b, re.MULTILINE)]
    chosen = (defining or blocks)[-1]
    return chosen.strip("\n") + "\n"
