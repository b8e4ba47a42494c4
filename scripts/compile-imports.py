"""Compile, once, the Python files a run imports: Tempered's packages and the libraries they load.

    .venv/bin/python scripts/compile-imports.py        (make setup, train and up run it)

Setup installs wheels with `pip --no-compile`: pip would otherwise byte-compile every file of
every wheel (26,000 files, about half of setup's time here), most of which nothing imports
(vLLM alone brings 5,000 files of API clients). Python then compiles each module the first time
it is imported, and keeps the result, unless PYTHONDONTWRITEBYTECODE is set (some images set
it; the Makefile empties it for what it runs). This script imports what every run needs, so the
first run starts as fast as the later ones even where that variable is set. It does not cover
modules imported only by tests or by the vLLM engine: those compile on first use under make.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

LIBRARIES = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "deepspeed",
    "peft",
    "temporalio.client",
    "temporalio.worker",
    "boto3",
    "opentelemetry.sdk.metrics",
]
PACKAGES = ["contracts", "workflows", "activities", "workers", "infra"]


def main() -> int:
    sys.dont_write_bytecode = False  # even where PYTHONDONTWRITEBYTECODE says otherwise
    for name in LIBRARIES:
        importlib.import_module(name)
    for package in PACKAGES:
        root = importlib.import_module(package)
        for module in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not module.name.endswith(".__main__"):  # that one runs the command line
                importlib.import_module(module.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
