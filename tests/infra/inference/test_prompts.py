"""Prompts of an episode, token in and token out: the first prompt is the chat template's
rendering (tools natively or by the fallback), each later prompt is the previous ids plus the
template's delta for the observation; feedback text; code extraction."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from contracts.rollout import CompletionRecord
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SandboxLimits
from infra.inference.prompts import (
    FEEDBACK_CHARS,
    OBSERVATION_CHARS,
    SYSTEM_PROMPT,
    WORKSPACE_SYSTEM_PROMPT,
    ChatFormat,
    clip,
    extract_code,
    feedback_text,
    observation_text,
)

QWEN_LIKE = (  # Qwen2.5's structure: tools in the system message, `tool` as a wrapped user turn
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '\\n\\n# Tools\\n"
    "<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages[1:] %}{%- if message.role == 'tool' %}"
    "{%- if messages[loop.index0].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 2].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
THINKING = (  # Qwen3's quirk: the *last* assistant message is rendered with a think block
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir))


def with_template(tokenizer: Any, template: str) -> Any:
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


def record(prompt: list[int], completion: list[int]) -> CompletionRecord:
    return CompletionRecord(
        text="",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        policy_version=0,
    )


def test_code_first_prompt_is_the_template_with_a_generation_prompt(tokenizer: Any) -> None:
    chat = ChatFormat(tokenizer, EnvName.CODE)
    text = tokenizer.decode(chat.first_prompt("Write add(a, b)."))
    assert text == tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Write add(a, b)."},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert chat.end_of_turn == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_next_prompt_is_previous_ids_then_the_rendered_observation(tokenizer: Any) -> None:
    """The ids are never re-rendered, yet equal the template's rendering of the conversation."""
    chat = ChatFormat(tokenizer, EnvName.CODE)
    first = chat.first_prompt("Write add(a, b).")
    answer = tokenizer.encode(
        "```python\ndef add(a, b): return a - b\n```", add_special_tokens=False
    )
    stopped = record(first, [*answer, chat.end_of_turn])  # ended with its end of turn
    feedback = feedback_text(ExecutionResult(status=ExecStatus.FAILED, stderr="AssertionError"))
    second = chat.next_prompt(stopped, feedback)
    assert second[: len(first) + len(answer) + 1] == first + answer + [chat.end_of_turn]
    assert tokenizer.decode(second) == tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Write add(a, b)."},
            {"role": "assistant", "content": tokenizer.decode(answer)},
            {"role": "user", "content": feedback},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    cut = record(first, answer)  # cut by max_new_tokens or a stop rule: the end of turn is added
    assert chat.next_prompt(cut, feedback) == second


def test_workspace_without_template_tools_uses_the_fallback(tokenizer: Any) -> None:
    chat = ChatFormat(tokenizer, EnvName.WORKSPACE)
    assert not chat.native_tools  # the tiny preset's ChatML, like SmolLM2's, ignores `tools`
    text = tokenizer.decode(chat.first_prompt("Fix the bug in calc.py."))
    assert text.startswith("<|im_start|>system\n" + WORKSPACE_SYSTEM_PROMPT + "\n\n# Tools")
    assert '"name": "write_file"' in text and "<tool_call>" in text
    delta = tokenizer.decode(chat.observation_ids("exit code 0"))
    assert delta == (
        "\n<|im_start|>user\n<tool_response>\nexit code 0\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_workspace_with_template_tools_uses_them_and_the_tool_role(tokenizer: Any) -> None:
    chat = ChatFormat(with_template(tokenizer, QWEN_LIKE), EnvName.WORKSPACE)
    assert chat.native_tools
    text = tokenizer.decode(chat.first_prompt("Fix it."))
    assert text.startswith("<|im_start|>system\n" + WORKSPACE_SYSTEM_PROMPT + "\n\n# Tools\n")
    assert text.count('"name": "bash"') == 1  # listed once, by the template
    delta = tokenizer.decode(chat.observation_ids("3 passed"))
    assert delta == (
        "\n<|im_start|>user\n<tool_response>\n3 passed\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_delta_ignores_how_the_last_assistant_message_is_rendered(tokenizer: Any) -> None:
    plain = ChatFormat(tokenizer, EnvName.CODE)
    thinking = ChatFormat(with_template(tokenizer, THINKING), EnvName.CODE)
    assert thinking.observation_ids("again") == plain.observation_ids("again")


def test_smollm2_template(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    smol = AutoTokenizer.from_pretrained(str(smollm2))
    chat = ChatFormat(smol, EnvName.WORKSPACE)
    assert not chat.native_tools and chat.end_of_turn == smol.eos_token_id
    first = chat.first_prompt("Fix it.")
    assert "You are a helpful AI assistant named SmolLM" not in smol.decode(first)
    delta = str(smol.decode(chat.observation_ids("ok")))
    assert delta.startswith("\n<|im_start|>user\n<tool_response>\nok\n</tool_response>")


def test_templates_without_an_end_of_turn_token_are_refused(tokenizer: Any) -> None:
    loose = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
    with pytest.raises(ValueError, match="not with a special token"):
        ChatFormat(with_template(tokenizer, loose), EnvName.CODE)

    class Plain:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(Plain(), EnvName.CODE)

    drops = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}"
    with pytest.raises(ValueError, match="drops the assistant's message text"):
        ChatFormat(with_template(tokenizer, drops + "<|im_end|>{% endfor %}"), EnvName.CODE)
    # the end of turn when the assistant speaks last, another token when a message follows
    unclosed = (
        "{% for m in messages %}{{ m.content }}"
        "{{ '<|im_end|>' if loop.last else '<|endoftext|>' }}{% endfor %}"
    )
    chat = ChatFormat(with_template(tokenizer, unclosed), EnvName.CODE)
    with pytest.raises(ValueError, match="does not close an assistant message with '<|im_end|>'"):
        chat.observation_ids("Tests failed.")


def test_long_tool_results_keep_head_and_tail() -> None:
    text = "".join(f"line {i}\n" for i in range(3000))
    clipped = clip(text)
    assert clipped.startswith("line 0\n") and clipped.endswith("line 2999\n")
    assert len(clipped) < OBSERVATION_CHARS + 60 and "characters left out" in clipped
    assert clip("short") == "short"
    assert clip("x" * OBSERVATION_CHARS) == "x" * OBSERVATION_CHARS  # the bound is inclusive
    assert "[... 1 characters left out ...]" in clip("x" * (OBSERVATION_CHARS + 1))


def test_feedback_reports_status_tests_and_output() -> None:
    failed = ExecutionResult(
        status=ExecStatus.FAILED,
        exit_code=1,
        tests_passed=1,
        tests_total=3,
        stderr="Traceback (most recent call last):\nAssertionError: add(2, 2) != 4",
        stdout="debug 42",
    )
    text = feedback_text(failed)
    assert "status: failed" in text and "Tests passed: 1/3." in text
    assert "AssertionError: add(2, 2) != 4" in text and "debug 42" in text
    assert text.rstrip().endswith("defining the function.")
    assert "limit" not in text
    limits = SandboxLimits(timeout_s=2.5, memory_mb=96)
    slow = feedback_text(ExecutionResult(status=ExecStatus.TIMEOUT, limits=limits))
    assert "Time limit: 2.5 s." in slow and "Memory" not in slow
    large = feedback_text(ExecutionResult(status=ExecStatus.MEMORY_EXCEEDED, limits=limits))
    assert "Memory limit: 96 MB." in large and "Time" not in large
    assert "Tests passed" not in slow  # a run that reported no tests


def test_a_stored_observation_reads_as_its_environment_wrote_it() -> None:
    result = ExecutionResult(status=ExecStatus.ERROR, stderr="NameError: name 'x'")
    as_code = observation_text(EnvName.CODE, result.model_dump_json().encode())
    assert as_code == feedback_text(result)
    as_tool = observation_text(EnvName.WORKSPACE, b"exit 1\n\xffNameError")
    assert as_tool == "exit 1\n\ufffdNameError"  # a tool's bytes, undecodable ones replaced


def test_feedback_quotes_only_the_tail_of_long_output() -> None:
    stderr = "".join(f"line {i}\n" for i in range(2000))
    result = ExecutionResult(status=ExecStatus.ERROR, stderr=stderr, stdout="x" * 5000)
    text = feedback_text(result)
    assert "line 1999" in text and "line 0\n" not in text
    assert len(text) < FEEDBACK_CHARS + 600
    assert "x" * 10 not in text  # stderr used the whole budget: stdout is only said left out
    assert "(stdout, 5000 characters, left out: stderr filled the quote)" in text
    exact = feedback_text(
        ExecutionResult(status=ExecStatus.ERROR, stderr="e" * FEEDBACK_CHARS, stdout="printed")
    )
    assert f"\n{'e' * FEEDBACK_CHARS}\n" in exact and "printed" not in exact  # whole, no room left


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


def test_a_template_that_prints_the_date_still_renders_after_midnight(tokenizer: Any) -> None:
    """The frame kept for the first prompt holds the date it was rendered on (Llama 3.2's
    "Today Date"): past midnight it no longer frames the prompt, and is rendered again."""
    import datetime

    import transformers.utils.chat_template_utils as chat_templates

    template = (
        "{%- set today = strftime_now('%d %b %Y') %}{%- for message in messages %}"
        "{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if message.role == 'system' %}{{- 'Today Date: ' + today + '\\n\\n' }}{%- endif %}"
        "{{- message.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )

    class Clock(datetime.datetime):
        at = datetime.datetime(2026, 12, 6, 23, 59)

        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return cls.at

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chat_templates, "datetime", Clock)
        chat = ChatFormat(with_template(tokenizer, template), EnvName.CODE)
        chat.first_prompt("Write add(a, b).")
        Clock.at = datetime.datetime(2026, 12, 7, 0, 1)
        ids = chat.first_prompt("Write add(a, b).")
        assert ids == ChatFormat(with_template(tokenizer, template), EnvName.CODE).first_prompt(
            "Write add(a, b)."
        )
