"""The workspace tools' calls: which tools there are, whether a call's arguments fit its tool,
and how a command's result reads to the agent.

    problem = bad_arguments(TOOLS["bash"], {"command": 3})   # "bash: command must be a string"
    text = command_text(result, limits.output_bytes)         # "exit code: 0\nstdout:\n..."

"killed" only where a limit ended the command (its status: `workspace_result.py`); a command
that ended by itself shows its exit code, and a note where a process of it hit the memory limit.

A call whose arguments do not fit is the agent's error, told back to it as an observation
(`workspace.py`); arguments no command or path can hold (a lone surrogate, a NUL, a command
longer than Linux takes) are refused here, where they would otherwise fail the step as the
platform's fault. Not covered: what a tool does (`workspace.py`, `paths.py`).
"""

from __future__ import annotations

from contracts.episode import WORKSPACE_TOOLS, ToolSpec
from contracts.sandbox import ExecStatus
from infra.environments.paths import is_utf8
from infra.sandbox.workspace import CommandResult

TOOLS: dict[str, ToolSpec] = {tool.name: tool for tool in WORKSPACE_TOOLS}

MAX_COMMAND_BYTES = 65_536
"""The longest `bash` command: it is one argument of `/bin/sh -c`, and Linux refuses an argument
over 128 KiB (E2BIG), which would fail the step as the platform's fault, again and again."""


def bad_arguments(tool: ToolSpec, arguments: dict[str, object]) -> str | None:
    """Why `arguments` do not fit `tool`'s schema (every argument a required string), or None."""
    expected = set(tool.parameters["properties"])
    if missing := sorted(expected - arguments.keys()):
        return f"{tool.name} needs the argument(s) {', '.join(missing)}"
    if extra := sorted(arguments.keys() - expected):
        return f"{tool.name} takes no argument(s) {', '.join(extra)}"
    if wrong := sorted(name for name, value in arguments.items() if not isinstance(value, str)):
        return f"{tool.name}: {', '.join(wrong)} must be a string"
    if broken := sorted(name for name, value in arguments.items() if not is_utf8(str(value))):
        # JSON's "\\ud83d" alone decodes to a lone surrogate, which no file or command can hold;
        # a parsed call never holds one (`toolcalls.parse_tool_call`): a call built otherwise
        return f"{tool.name}: {', '.join(broken)} is not valid Unicode (a lone surrogate)"
    # a file may hold NULs; no command or path can (a ValueError, retried as a platform fault)
    if nul := sorted(n for n, value in arguments.items() if "\0" in str(value) and n != "content"):
        return f"{tool.name}: {', '.join(nul)} holds a NUL"
    if tool.name == "bash" and len(str(arguments["command"]).encode()) > MAX_COMMAND_BYTES:
        return (
            f"bash: the command is longer than {MAX_COMMAND_BYTES} bytes; write it to a file "
            "with write_file and run that"
        )
    return None


def command_text(result: CommandResult, limit: int) -> str:
    """A command's observation: how it ended (killed by a limit, its exit code, or not started
    at all), what else its run met (`note`) and what it printed."""
    if result.status in (ExecStatus.TIMEOUT, ExecStatus.MEMORY_EXCEEDED):
        lines = [f"the command was killed: {result.detail}"]
    elif result.exit_code is None:
        lines = [f"the command did not start: {result.detail}"]
    else:
        lines = [f"exit code: {result.exit_code}"]
    if result.note:
        lines.append(f"({result.note})")
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            lines += [f"{name}:", text.rstrip("\n")]
    if result.truncated:
        lines.append(f"(a stream over {limit} bytes keeps its first and last {limit // 2})")
    return "\n".join(lines)
