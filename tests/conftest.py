"""Shared fixtures: real servers only (Temporal dev server, SeaweedFS), on free ports."""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.temporal",
    "tests.fixtures.stack",
    "tests.fixtures.openmp",
    "tests.fixtures.models",
]
