"""Prompt rendering (system, task, completion/feedback history) and code extraction."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from infra.inference.prompts import (
    FEEDBACK_CHARS,
    SYSTEM_PROMPT,
    build_messages,
    encode_messages,
    extract_code,
    feedback_text,
)
from infra.policy import materialize_base_model
from infra.settings import Settings


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import AutoTokenizer

    home: Path = tmp_path_factory.getbasetemp() / "home"
    return AutoTokenizer.from_pretrained(str(materialize_base_model("tiny", Settings(home=home))))


def test_first_turn_is_system_and_task() -> None:
    assert build_messages("Write add(a, b).") == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Write add(a, b)."},
    ]


def test_history_renders_each_completion_and_its_feedback() -> None:
    failed = ExecutionResult(
        status=ExecStatus.FAILED,
        exit_code=1,
        tests_passed=1,
        tests_total=3,
        stderr="Traceback (most recent call last):\nAssertionError: add(2, 2) != 4",
        stdout="debug 42",
    )
    slow = ExecutionResult(status=ExecStatus.TIMEOUT, limits=SandboxLimits(timeout_s=2.5))
    messages = build_messages("Write add.", [("first try", failed), ("second try", slow)])
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[2]["content"] == "first try" and messages[4]["content"] == "second try"
    first_feedback = messages[3]["content"]
    assert "status: failed" in first_feedback and "Tests passed: 1/3." in first_feedback
    assert "AssertionError: add(2, 2) != 4" in first_feedback and "debug 42" in first_feedback
    assert first_feedback.rstrip().endswith("defining the function.")
    assert "status: timeout" in messages[5]["content"]
    assert "Time limit: 2.5 s." in messages[5]["content"]


def test_feedback_quotes_only_the_tail_of_long_output() -> None:
    stderr = "".join(f"line {i}\n" for i in range(2000))
    result = ExecutionResult(status=ExecStatus.ERROR, stderr=stderr, stdout="x" * 5000)
    text = feedback_text(result)
    assert "line 1999" in text and "line 0\n" not in text
    assert len(text) < FEEDBACK_CHARS + 600
    assert "stdout" not in text  # stderr used the whole budget


def test_prompt_ids_are_the_chat_template_with_a_generation_prompt(tokenizer: object) -> None:
    messages = build_messages("Write add(a, b).")
    ids = encode_messages(tokenizer, messages)
    text = tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
    assert text.endswith("<|im_start|>user\nWrite add(a, b).<|im_end|>\n<|im_start|>assistant\n")
    rendered = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages, tokenize=False, add_generation_prompt=True
    )
    assert text == rendered


def test_a_tokenizer_without_chat_template_is_refused(tokenizer: object) -> None:
    class Plain:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        encode_messages(Plain(), build_messages("x"))


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
        (
            "```py\nimport math\ndef f(x):\n    return math.sqrt(x)\n```",
            "import math\ndef f(x):\n    return math.sqrt(x)\n",
        ),
        # the block that defines the function wins over a later usage example
        (
            "```python\ndef f():\n    return 2\n```\nExample:\n```python\nprint(f())\n```",
            "def f():\n    return 2\n",
        ),
        # a refinement after a first attempt: the last defining block wins
        (
            "```python\ndef f(): return 0\n```\nBetter:\n```python\ndef f(): return 3\n```",
            "def f(): return 3\n",
        ),
        # untagged fences count; other languages do not
        ("```bash\npip install x\n```\n```\ndef g(): pass\n```", "def g(): pass\n"),
        # cut off by max_new_tokens inside the block: the block runs to the end
        ("```python\ndef f(x):\n    return x +", "def f(x):\n    return x +\n"),
        # no fence: the whole text is the program
        ("def f():\n    return 4\n", "def f():\n    return 4\n"),
        # only another language's block: nothing to run
        ("```bash\necho hi\n```", ""),
    ],
)
def test_extract_code(completion: str, code: str) -> None:
    assert extract_code(completion) == code
