"""`tempered train --suite ''` (or blanks) named the working directory as the unknown suite.

.venv/bin/python -m pytest -q tests/workers/cli/test_empty_suite62.py
"""

from __future__ import annotations

import pytest

from workers.cli.train_inputs import absolute


@pytest.mark.parametrize("spec", ["", " ", "\t"])
def test_an_empty_suite_or_model_is_left_as_given_not_made_the_working_directory(
    spec: str,
) -> None:
    assert absolute(spec) == spec
