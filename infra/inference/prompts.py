"""An episode's prompts, token in and token out, and the code extracted from a completion.

    chat = ChatFormat(tokenizer, EnvName.WORKSPACE)
    ids = chat.first_prompt(task_prompt, turns=3)           # step 0: system + task (+ tools)
    ids = chat.next_prompt(previous_record, observation, turn=1, turns=3)   # step k > 0
    code = extract_code(completion_text)                    # the `code` environment's action
    program_closed(text_so_far)                             # where stop_after_code_block stops
    closed, at = program_scan(longer_text, at)              # the same, as a row grows

Step 0 renders the system prompt and the task with the tokenizer's chat template (for
`workspace` the tools too: as the template's `tools=` where it renders them, else the fallback
block of `infra.inference.toolcalls`) and appends the generation prompt.

Step k > 0 never re-renders or re-tokenizes the conversation. Its prompt is, exactly:

    previous.prompt_token_ids + previous.completion_token_ids
    + [end_of_turn]          only if the completion did not end with it (cut by
                             max_new_tokens, or stopped after its code block / tool call)
    + observation_ids(obs)   the template's rendering of one more message and the
                             generation prompt, tokenized on its own

`observation_ids` is the delta of the template: it renders [system, user, assistant(P),
observation] with a placeholder P as the assistant's text, and keeps what follows
P + end_of_turn (e.g. `\\n<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n`). Only
the suffix after the assistant's text is used, so templates that render the *last* assistant
message differently (Qwen3's think block) give the same delta. `end_of_turn` is the special
token the template closes an assistant message with (`<|im_end|>` for ChatML); a template that
closes it with anything else is refused with a clear error.

A template that cannot render an episode's prompts raises `ChatTemplateError` (a ValueError)
naming what it failed on: no template, one that refuses a message (Gemma's and
Mistral-Instruct's `raise_exception('System role not supported')`), fails while rendering, or
renders in a way token-in/token-out cannot follow. Rendering is computation on the template and
the messages alone, so it fails alike on every attempt: the generate activity does not retry it.

The observation message: for `code`, a `user` message with the test log and a request to fix
(`feedback_text`; the model called no tool, so there is no tool result to answer); for
`workspace`, the tool's result as a `tool` message, or the fallback `user` message wrapping it
in `<tool_response>` tags (`toolcalls.observation_message`). Either is clipped to
`OBSERVATION_CHARS` characters and about `OBSERVATION_TOKENS` tokens (head and tail kept).

What a `workspace` episode is told besides its task and the tools' results, here and nowhere
else: after the task, its turns and when its workspace is graded (`grading_text`); after each
result, lines the clip never cuts (`observation_notes`): the calls of the previous turn that
were not run (one call a turn; before, dropped without a word) and which turn this is of how
many. The number of turns is the request's (`turns`); where none is given, the task is told
only that it is graded when its turns run out or it submits, and no turn count is shown.

The task and the observation are not the template's text: a special token's text in them (a
tool printing `<|im_end|>`) is encoded as ordinary tokens, never as the special token
(`infra.inference.untrusted`); ordinary text gets the template's ids unchanged.

Not covered: the tool-call format itself (`infra.inference.toolcalls`), sampling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from contracts.episode import WORKSPACE_TOOLS
from contracts.rollout import CompletionRecord
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName
from infra.inference import toolcalls
from infra.inference.calltags import starts_thinking
from infra.inference.untrusted import OBSERVATION_CHARS as OBSERVATION_CHARS  # re-exported
from infra.inference.untrusted import OBSERVATION_TOKENS as OBSERVATION_TOKENS
from infra.inference.untrusted import UntrustedText, clip

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the task by writing the requested function. "
    "Answer with exactly one ```python code block that defines the function (and any imports "
    "or helpers it needs); do not include tests, example usage or input() calls."
)
WORKSPACE_SYSTEM_PROMPT = (
    "You are an expert software engineer working in a repository. Use the tools to read the "
    "code, change it and run its tests. Call exactly one function per turn and wait for its "
    "result. When the task is done, call submit."
)
FEEDBACK_CHARS = 1500
"""Most characters of program output quoted back in one `code` feedback message."""
PLACEHOLDER = "TEMPERED-ASSISTANT-PLACEHOLDER"
CONTENT = "TEMPERED-CONTENT-PLACEHOLDER"
"""Stands for the task or the observation: where the template puts it, the untrusted span."""

_STATUS_TEXT = {
    ExecStatus.PASSED: "All tests passed.",
    ExecStatus.FAILED: "Your code ran but failed the tests.",
    ExecStatus.ERROR: "Your code raised an error.",
    ExecStatus.TIMEOUT: "Your code exceeded the time limit.",
    ExecStatus.MEMORY_EXCEEDED: "Your code exceeded the memory limit.",
    ExecStatus.INFRA_ERROR: "Your code could not be run because of a platform error.",
}

_FENCE = re.compile(
    r"(?:(?<![^\n])```(?!`)|```(?!`)(?=[^\n`]*+\n))"
    r"[ \t]*+([A-Za-z0-9_+-]*+)(?>(?:[^\n`]|`(?!``))*)\n(.*?)(```|\Z)",
    re.DOTALL,
)
"""A fenced block: its tag, its body, its closing fence ("" where the text ends inside it). A
fence is three backticks not followed by a fourth (```` ````bash ```` is bash's); one that starts
its line (as Markdown's) may have backticks, no fence, after its tag (```` ```py  # `x` ````), one
mid-line none (```` use ``` and `print` ```` opened a block that ate the real fence). A scan ends
at a backtick, fence or newline, without backtracking: linear in a row of backticks."""
_PYTHON_TAGS = {"", "python", "python3", "py"}
_DEFINES = re.compile(r"^\s*(async\s+)?def\s", re.MULTILINE)


def _tail(text: str, limit: int) -> tuple[str, int]:
    """The last `limit` characters of `text` (trailing whitespace dropped), "..." before them
    where some were cut, and how many of the output's characters that shows."""
    text = text.rstrip()
    if limit <= 0 or not text:
        return "", 0
    if len(text) <= limit:
        return text, len(text)
    return "..." + text[-limit:], limit


def feedback_text(result: ExecutionResult, max_chars: int = FEEDBACK_CHARS) -> str:
    """The `code` observation: status, tests, output tails, a request to fix."""
    lines = [f"{_STATUS_TEXT[result.status]} (status: {result.status.value})"]
    if result.tests_total:
        lines.append(f"Tests passed: {result.tests_passed}/{result.tests_total}.")
    if result.status is ExecStatus.TIMEOUT:
        lines.append(f"Time limit: {result.limits.timeout_s:g} s.")
    elif result.status is ExecStatus.MEMORY_EXCEEDED:
        lines.append(f"Memory limit: {result.limits.memory_mb} MB.")
    stderr = _tail(result.stderr, max_chars)
    stdout = _tail(result.stdout, max_chars - stderr[1])
    for name, (tail, count) in (("stderr", stderr), ("stdout", stdout)):
        if tail:
            lines.append(f"{name} (last {count} characters):\n```\n{tail}\n```")
    if result.stdout.rstrip() and not stdout[0]:
        left_out = len(result.stdout.rstrip())
        lines.append(f"(stdout, {left_out} characters, left out: stderr filled the quote)")
    lines.append(
        "Fix the code and answer again with one ```python code block defining the function."
    )
    return "\n".join(lines)


def observation_text(env: EnvName, data: bytes) -> str:
    """What the model reads of a stored observation: `code` stores the execution's result.json
    (rendered by `feedback_text`), `workspace` the tool's result as text."""
    if env is EnvName.CODE:
        return feedback_text(ExecutionResult.model_validate_json(data))
    return data.decode("utf-8", errors="replace")


def grading_text(turns: int | None) -> str:
    """What a `workspace` task's message ends with: its turns (None: not known) and when its
    workspace is graded (a task that asks for more steps than it has still scores)."""
    if turns is None:
        return "Your workspace is graded when your turns run out or when you call submit."
    return (
        f"You have {turns} turn{'s' if turns != 1 else ''}; your workspace is graded when they "
        "run out or when you call submit."
    )


def observation_notes(
    completion: str, turn: int | None, turns: int | None, *, thinking: bool = False
) -> str:
    """The lines a `workspace` observation ends with: the calls of `completion` (the previous
    turn's text, `thinking` where its prompt opened a think block) not run, and which turn
    `turn` (0-based, the one to be sampled) is of `turns`."""
    lines = []
    if further := toolcalls.further_calls(completion, thinking=thinking):
        plural = "s" if further > 1 else ""
        lines.append(f"({further} further call{plural} ignored: one call per turn)")
    if turn is not None and turns is not None:
        last = ", the last" if turn + 1 >= turns else ""
        lines.append(f"(turn {turn + 1} of {turns}{last})")
    return "".join(f"\n{line}" for line in lines)


class ChatTemplateError(ValueError):
    """The policy's chat template cannot render an episode's prompts (the module's docstring)."""


@contextmanager
def _rendering(messages: Sequence[dict[str, str]], tools: bool = False) -> Iterator[None]:
    """What the template raises while rendering `messages`, as a ChatTemplateError naming them
    (jinja2's TemplateError from `raise_exception`, a TypeError of its own code: all recur)."""
    try:
        yield
    except (ChatTemplateError, MemoryError):
        raise
    except Exception as exc:
        roles = ", ".join(m["role"] for m in messages) + (" with tools" if tools else "")
        raise ChatTemplateError(
            f"the chat template fails to render messages ({roles}): {type(exc).__name__}: {exc}"
        ) from exc


def task_messages(prompt: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The first turn's conversation: the system prompt, then the task."""
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


class ChatFormat:
    """How one tokenizer's chat template renders the episodes of one environment."""

    def __init__(self, tokenizer: Any, env: EnvName):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("the policy's tokenizer has no chat template")
        self.tokenizer, self.env = tokenizer, env
        self.tools = WORKSPACE_TOOLS if env is EnvName.WORKSPACE else ()
        with _rendering(task_messages(""), tools=True):
            self.native_tools = bool(self.tools) and toolcalls.template_renders_tools(
                tokenizer, self.tools
            )
        self._template_args: dict[str, Any] = (
            {"tools": toolcalls.tool_schemas(self.tools)} if self.native_tools else {}
        )
        self.end_of_turn, self._end_of_turn_text = self._find_end_of_turn()
        self.untrusted = UntrustedText(tokenizer)
        self._frames: dict[Callable[[str], str], tuple[str, str]] = {}

    def system_prompt(self) -> str:
        if self.env is EnvName.CODE:
            return SYSTEM_PROMPT
        if self.native_tools:
            return WORKSPACE_SYSTEM_PROMPT
        return f"{WORKSPACE_SYSTEM_PROMPT}\n\n{toolcalls.tools_system_block(self.tools)}"

    def first_prompt(self, prompt: str, turns: int | None = None) -> list[int]:
        """Step 0: system prompt and task, generation prompt appended (the task is untrusted:
        task files come from suites), as `task_text` gives it."""
        return self._encode(self._first, self.task_text(prompt, turns))

    def task_text(self, prompt: str, turns: int | None = None) -> str:
        """The task's message: `prompt`, for `workspace` followed by `grading_text(turns)`."""
        if self.env is EnvName.WORKSPACE:
            return f"{prompt}\n\n{grading_text(turns)}"
        return prompt

    def _first(self, task: str) -> str:
        messages = task_messages(task, self.system_prompt())
        with _rendering(messages, tools=self.native_tools):
            text: str = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **self._template_args
            )
        return text

    def observation_message(self, text: str, notes: str = "") -> dict[str, str]:
        """The observation as the next message, clipped (`clip`: characters, then tokens), then
        `notes` (`observation_notes`: never clipped)."""
        return self._message(self._shown(text, notes))

    def _shown(self, text: str, notes: str) -> str:
        return clip(text, count_tokens=self.untrusted.count) + notes

    def _message(self, shown: str) -> dict[str, str]:
        if self.env is EnvName.CODE:
            return {"role": "user", "content": shown}
        return toolcalls.observation_message(shown, tool_role=self.native_tools)

    def observation_ids(self, text: str, notes: str = "") -> list[int]:
        """The template's tokens between an assistant's end of turn and the next generation."""
        return self._encode(self._delta, self._shown(text, notes))

    def _delta(self, shown: str) -> str:
        rendered = self._render_after_assistant(self._message(shown))
        if not rendered.startswith(self._end_of_turn_text):
            raise ChatTemplateError(
                "the chat template does not close an assistant message with "
                f"{self._end_of_turn_text!r} when another message follows"
            )
        return rendered[len(self._end_of_turn_text) :]

    def _encode(self, render: Callable[[str], str], content: str) -> list[int]:
        """`render(content)` tokenized with `content` as untrusted text. Its span is what the
        template writes between the text it writes around a placeholder, so a template that
        alters a message's text (trims it, say) still has all of it treated as untrusted.
        The frame (`render(CONTENT)`) is kept per `render` and rendered again when the text no
        longer fits it: a template may print the date (`strftime_now`), which changes at midnight."""
        rendered = render(content)
        for fresh in (False, True):
            if fresh or render not in self._frames:
                self._frames[render] = self._frame(render)
            before, after = self._frames[render]
            end = len(rendered) - len(after)
            if rendered.startswith(before) and rendered.endswith(after) and end >= len(before):
                return self.untrusted.encode(rendered, (len(before), end))
        raise ChatTemplateError("the chat template renders a message differently for its text")

    @staticmethod
    def _frame(render: Callable[[str], str]) -> tuple[str, str]:
        """The text `render` writes before and after a message's text."""
        frame = render(CONTENT)
        if frame.count(CONTENT) != 1:
            raise ChatTemplateError(
                "the chat template does not render a message's text exactly once"
            )
        before, after = frame.split(CONTENT)
        return before, after

    def next_prompt(
        self,
        previous: CompletionRecord,
        observation: str,
        turn: int | None = None,
        turns: int | None = None,
    ) -> list[int]:
        """Step k > 0: the previous step's exact ids, its end of turn, the observation (for
        `workspace` with its `observation_notes`: `turn` is k, `turns` the episode's)."""
        ids = [*previous.prompt_token_ids, *previous.completion_token_ids]
        if previous.completion_token_ids[-1:] != [self.end_of_turn]:
            ids.append(self.end_of_turn)
        notes = ""
        if self.env is EnvName.WORKSPACE:
            # a guided turn is its call alone: read as thinking or not, it has no further calls
            thinking = starts_thinking(previous.prompt_token_ids, self.tokenizer.decode)
            notes = observation_notes(previous.text, turn, turns, thinking=thinking)
        return ids + self.observation_ids(observation, notes)

    def _render_after_assistant(self, *following: dict[str, str]) -> str:
        """The template's text after an assistant message's content (P), `following` after it."""
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": PLACEHOLDER},
            *following,
        ]
        with _rendering(messages, tools=self.native_tools):
            rendered: str = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=bool(following),
                **self._template_args,
            )
        at = rendered.find(PLACEHOLDER)
        if at < 0:
            raise ChatTemplateError("the chat template drops the assistant's message text")
        return rendered[at + len(PLACEHOLDER) :]

    def _find_end_of_turn(self) -> tuple[int, str]:
        after = self._render_after_assistant()
        ids = self.tokenizer.encode(after, add_special_tokens=False)
        if not ids or ids[0] not in set(self.tokenizer.all_special_ids):
            raise ChatTemplateError(
                f"the chat template ends an assistant message with {after!r}, not with a "
                "special token: token-in/token-out episodes need an end-of-turn token"
            )
        return int(ids[0]), self.tokenizer.decode([ids[0]])


def extract_code(text: str) -> str:
    """The program in a completion.

    Fenced blocks tagged python/py/python3 or untagged count (an unterminated block, cut by
    max_new_tokens, runs to the end). The last such block that defines a function wins, since
    models put examples before and refinements after; else the last such block; else, with no
    fence at all, the whole text (a model that answers with bare code still gets run); with
    fences of other languages only, an empty program.
    """
    blocks = [m.group(2) for m in _program_blocks(text)]
    if not blocks:
        return text.strip() + "\n" if "```" not in text else ""
    defining = [b for b in blocks if _DEFINES.search(b)]
    chosen = (defining or blocks)[-1]
    return chosen.strip("\n") + "\n"


def program_closed(text: str) -> bool:
    """Whether `text` holds a closed block that `extract_code` runs, before any other it would
    prefer: one it counts that defines a function. Where `stop_after_code_block` ends a turn
    (`infra.inference.stops`), so a turn cut there runs that block: not a ```bash block before it
    (never run), nor an example (`>>> add(1, 2)`, which a defining block after it would beat). A
    turn with no such block is not ended early; `extract_code` then takes the last it counts."""
    return program_scan(text)[0]


def program_scan(text: str, at: int = 0) -> tuple[bool, int]:
    """`program_closed` of a text that grows: whether `text` holds such a block from `at` on,
    and where the scan of a longer text goes on: the end of the last closed block, or the first
    place a block may still open (an open block's fence, the last three backticks of a line
    that has no newline yet). The stop rule's: each block is read about once, however long the
    row and however many fences it writes."""
    for match in _FENCE.finditer(text, at):
        if not match.group(3):  # open: closed later at its first fence, read again then
            return False, match.start()
        at = match.end()
        if match.group(1).lower() in _PYTHON_TAGS and _DEFINES.search(match.group(2)):
            return True, at
    # a fence of the last line (no newline yet) may still open one: the last there (those
    # before it are dead, a fence being in their rest), or backticks that may yet become one
    fence = text.rfind("```", max(at, text.rfind("\n") + 1))
    tick = text.rfind("`", at)
    return False, fence if fence >= 0 else len(text) if tick < 0 else max(at, tick - 2)


def _program_blocks(text: str) -> Iterator[re.Match[str]]:
    """The fenced blocks `extract_code` counts: tagged python/py/python3, or untagged."""
    return (m for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_TAGS)
