#!/bin/bash
# The names come from the task's own copy (tests/names.txt, read-only at /tests): the agent may
# rewrite names.txt (one name in both files once scored 1). -I: no module of the workspace, the
# working directory, is imported in place of the standard library's (a pathlib.py once was).
python3 -I - <<'PY'
from pathlib import Path

names = [n for n in Path("/tests/names.txt").read_text().split("\n") if n.strip()]
expected = sorted(names, key=lambda n: (n.split()[-1].lower(), n.split()[0].lower()))
answer = Path("/srv/project/sorted.txt")
got = []
if answer.is_file():  # not a FIFO, whose read would wait
    got = [n for n in answer.read_text(errors="replace").split("\n") if n.strip()]
reward = 1.0 if got == expected else 0.5 if sorted(got) == sorted(expected) else 0.0
Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
