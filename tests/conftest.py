"""Shared fixtures: real servers only (Temporal dev server, SeaweedFS), on free ports.

And two collection hooks for how `make test` schedules the suite (tests/test_make_test_schedule.py):
a test marked `alone` in a file the Makefile's ALONE_TESTS does not list is a collection error
(the serial run collects only those files, the parallel run deselects `alone`: neither would run
it), and `--dist loadgroup` runs each module `xdist_group` marks (with the others of its group) on
one worker, reading the marks itself (pytest-xdist's own reading fails under pytest 9).
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.temporal",
    "tests.fixtures.stack",
    "tests.fixtures.openmp",
    "tests.fixtures.models",
    "tests.fixtures.settings_env",
    "tests.fixtures.trained_stack",
]


@cache
def alone_files(makefile: Path) -> tuple[str, ...]:
    """The files the Makefile's ALONE_TESTS names (the one list of them): `make test`'s serial
    run of the `alone` tests collects these, relative to the checkout's root."""
    text = makefile.read_text() if makefile.is_file() else ""
    found = re.search(r"^ALONE_TESTS\s*:?=(.*)$", text.replace("\\\n", " "), re.MULTILINE)
    return tuple(found.group(1).split()) if found else ()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    root = collector.config.rootpath
    listed = alone_files(root / "Makefile")
    stray = [
        item.nodeid
        for item in report.result
        if isinstance(item, pytest.Item)
        and item.get_closest_marker("alone") is not None
        and Path(os.path.relpath(item.path, root)).as_posix() not in listed
    ]
    if stray and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"marked `alone`, in a file the Makefile's ALONE_TESTS does not list (`make test` "
            f"would run them in neither of its runs): {', '.join(stray)}"
        )
    return report


GROUP_MARK = re.compile(r"xdist_group\(\s*(?:(__name__)|[\"']([^\"']+)[\"'])\s*\)")
"""A module's `xdist_group` mark, as written in its `pytestmark`: `__name__` or a literal."""


@cache
def module_group(path: Path, root: Path) -> str | None:
    """The group of the test module at `path` (its `xdist_group` mark), None where it has none."""
    text = path.read_text() if path.suffix == ".py" and path.is_file() else ""
    found = GROUP_MARK.search(text)
    if found is None:
        return None
    if found.group(1):  # __name__: the module's dotted name
        return ".".join(path.relative_to(root).with_suffix("").parts)
    return found.group(2)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # pytest-xdist's: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by module: a test module marked `xdist_group(name)` runs whole on one
    worker, with every module of that name, so its costly module (or shared) fixture is set up
    once; any other test goes wherever a worker is free. pytest-xdist (3.8) groups by a suffix
    it writes into each test's node id (`…::test@name`), which pytest 9 no longer reads (each
    test of a group went to either worker); renaming the ids instead broke `--lf` and a pasted
    id. Here the controller reads the marks from the modules' text (`module_group`), and the
    ids stay as they are."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModuleGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            group = module_group(root / nodeid.split("::", 1)[0], root)
            return nodeid if group is None else f"group:{group}"

    return ModuleGroups(config, log)
