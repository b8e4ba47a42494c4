#!/bin/bash
python3 - <<'PY'
from pathlib import Path

names = Path("/srv/project/names.txt").read_text().split("\n")
names = [n for n in names if n.strip()]
expected = sorted(names, key=lambda n: (n.split()[-1].lower(), n.split()[0].lower()))
try:
    got = [n for n in Path("/srv/project/sorted.txt").read_text().split("\n") if n.strip()]
except FileNotFoundError:
    got = []
reward = 1.0 if got == expected else 0.5 if sorted(got) == sorted(expected) else 0.0
Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
