"""The program run *inside* every sandbox: runs untrusted code, then its tests, and reports.

Backends start it as `python3 -S -I -c <this file's source>` (see `HARNESS_SOURCE`) with the job
on stdin as one JSON object `{program, tests, entry_point, nonce, rlimits}` and a verdict pipe
on fd 3. It never runs as a module of the worker.

Why a reward cannot be faked (the program runs first, in this same interpreter):
- The verdict is a JSON line on fd 3 carrying a random per-run nonce that arrives on stdin, is
  kept only in a closure cell referenced from `main`'s frame, and never touches argv, env, files,
  sys.modules or any namespace the program sees. The host ignores lines without the nonce, and
  `passed` is only ever written after every test unit ran and returned normally.
- An audit hook (which user code cannot remove) refuses the ways to reach that frame or cell:
  frame and generator introspection, gc traversal, tracing/profiling, new audit hooks, ctypes
  and opening /proc/*/mem. Refusals raise ValueError, which the stdlib's own frame users
  (namedtuple, logging) already tolerate.
- `os._exit`, `sys.exit`, `SystemExit` in `check`, killed harness, fork-and-exit: no verdict line
  (or a `failed` one), so the host reports `failed`. Printing success markers does nothing:
  stdout is not a verdict channel. The tests are a string held by the harness, never a file.
- Tests run in their own namespace: a copy of the program's names minus any that shadow a
  builtin, with a private pristine builtins dict; modules the program patched are restored and
  modules it imported are dropped first. So `builtins.abs = ...`, `AssertionError = ...`,
  `def check(...)`, `math.isclose = ...` at the program's top level cannot change what the tests
  see. Code the *candidate* runs while being tested can still patch shared modules (same
  interpreter, by HumanEval's contract); objects that lie in `__eq__` are the test's business.

Test units: every top-level `assert` of `tests` is one unit (each runs, a failing one does not
stop the next), plus `check(<entry_point>)` when an entry point is given; tests with neither are
one unit run as a whole. The verdict is `passed` only when every unit passed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VERDICT_FD = 3
"""File descriptor of the verdict pipe inside the sandbox."""

HARNESS_SOURCE = Path(__file__).read_text() if __name__ != "__main__" else ""
"""This file's source, passed to `python3 -c` by the backends."""

