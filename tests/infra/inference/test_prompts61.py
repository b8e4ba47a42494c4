"""The `code` feedback's output quotes say what they show (`infra.inference.prompts`): a clipped
tail's label counts the output's characters it quotes (not the "..." before them), and stdout
left out because stderr filled the budget is said to be left out."""

from __future__ import annotations

from contracts.sandbox import ExecStatus, ExecutionResult
from infra.inference.prompts import FEEDBACK_CHARS, feedback_text


def test_a_clipped_tail_is_labelled_with_the_characters_it_shows() -> None:
    stderr = "e" * (FEEDBACK_CHARS + 500)
    text = feedback_text(ExecutionResult(status=ExecStatus.ERROR, stderr=stderr))
    assert (
        f"stderr (last {FEEDBACK_CHARS} characters):\n```\n...{'e' * FEEDBACK_CHARS}\n```" in text
    )
    whole = feedback_text(ExecutionResult(status=ExecStatus.ERROR, stderr="boom"))
    assert "stderr (last 4 characters):\n```\nboom\n```" in whole


def test_stdout_left_out_for_want_of_room_is_said_to_be() -> None:
    full = "e" * (FEEDBACK_CHARS + 10)
    text = feedback_text(ExecutionResult(status=ExecStatus.ERROR, stderr=full, stdout="out 42"))
    assert "out 42" not in text
    notes = [line for line in text.splitlines() if "stdout" in line]
    assert notes == ["(stdout, 6 characters, left out: stderr filled the quote)"]
    # room left for part of stdout: its tail, labelled with what it shows
    room = feedback_text(
        ExecutionResult(
            status=ExecStatus.ERROR, stderr="e" * (FEEDBACK_CHARS - 4), stdout="abcdefgh"
        )
    )
    assert "stdout (last 4 characters):\n```\n...efgh\n```" in room
    # nothing to leave out: no note
    quiet = feedback_text(ExecutionResult(status=ExecStatus.ERROR, stderr=full))
    assert "stdout" not in quiet
