"""Where the checkout is, for tests that read its files (the package itself never needs this)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The root of the source checkout the tests run from."""
