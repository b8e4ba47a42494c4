"""What the CLI's help and the README promise holds: `tempered sandbox run PROGRAM.py --tests
TESTS.py` does not pass a wrong program because its HumanEval-form tests were never called, and
`train --suite` lists only suites it can train on. No sandbox, Temporal or S3 needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import Settings
from infra.tasks import BUILTIN_SUITES, load_suite
from workers.cli import build_parser, run
from workers.cli.sandbox import uncalled_check

HUMANEVAL_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def test_sandbox_run_refuses_check_form_tests_without_an_entry_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`def add(a, b): return a - b` printed `status: passed, tests 1/1`: the tests only defined
    `check`, and nothing called it."""
    program, tests = tmp_path / "wrong.py", tmp_path / "tests.py"
    program.write_text("def add(a, b):\n    return a - b\n")
    tests.write_text(HUMANEVAL_TESTS)
    argv = ["sandbox", "run", str(program), "--tests", str(tests), "--backend", "local"]
    assert run(argv, Settings(home=tmp_path / "home")) == 2
    err = capsys.readouterr().err
    assert err == (
        f"tempered sandbox: {tests} defines check(candidate) and nothing calls it: name the "
        "program's function with --entry-point (without it any program passes)\n"
    )


@pytest.mark.parametrize(
    ("tests", "uncalled"),
    [
        (HUMANEVAL_TESTS, True),
        ("async def check(candidate):\n    assert await candidate() == 1\n", True),
        (HUMANEVAL_TESTS + "check(add)\n", False),  # the tests call it themselves
        (HUMANEVAL_TESTS + "for f in (add,):\n    check(f)\n", False),
        ("assert add(2, 3) == 5\n", False),  # top-level asserts are the tests
        ("", False),
        ("def check(:\n", False),  # not Python: the verifier reports it
        ("def check(candidate):\n    check(candidate)\n", True),  # only calls itself
    ],
)
def test_uncalled_check(tests: str, uncalled: bool) -> None:
    assert uncalled_check(tests) is uncalled


def test_train_suite_help_lists_only_suites_with_training_tasks() -> None:
    """It listed humaneval, which `tempered train` refuses: its 164 tasks are all held out."""
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    (suite,) = [a for a in train._actions if "--suite" in a.option_strings]
    listed = {name.strip() for name in suite.help.split("(")[0].split("|")}
    assert {"harbor:DIR", "FILE.jsonl"} <= listed
    for name in BUILTIN_SUITES:
        trains = bool(load_suite(name, split="train"))
        assert (name in listed) is trains, name
