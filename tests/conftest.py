"""Shared fixtures: real servers only (Temporal dev server, SeaweedFS), on free ports.

And two collection hooks for how `make test` schedules the suite (tests/test_make_test_schedule.py):
a test marked `alone` in a file the Makefile's ALONE_TESTS does not list is a collection error
(the serial run collects only those files, the parallel run deselects `alone`: neither would run
it), and `--dist loadgroup` keeps an `xdist_group` on one worker under pytest 9.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from functools import cache
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker's share of `--dist loadgroup`: pytest-xdist (3.8) names a test's group in its
    nodeid ("…::test@group", what the scheduler groups by) by setting `item._nodeid`, which
    pytest 9 no longer reads; unmended, each test of a group went to either worker."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        marks = item.iter_markers("xdist_group")
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        )
        if names and not item.nodeid.endswith(suffix := "@" + "_".join(names)):
            item._id = NodeId.parse(item.nodeid + suffix)
