"""The bench scripts import each other as top-level modules (`from common import ...`), as they
do when run as `python bench/X.py`: their folder goes on sys.path for these tests."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
