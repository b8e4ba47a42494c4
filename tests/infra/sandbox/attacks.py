"""Wrong programs that try to get `passed` from a sandbox, by class (test_adversarial.py runs them).

Each is a *wrong* `add` (`WRONG` is appended to those that define none) plus one trick of a
class issue 10 names. `TESTS` are what they all face; the honest `add` passes them. The design
makes each class impossible rather than blocking these instances (the grader lives in another
process, under another uid, in another pid namespace or kernel, and only plain data crosses);
more cases than these are held outside the project.
"""

from __future__ import annotations

WRONG = "def add(a, b):\n    return a - b\n"
TESTS = (
    "import math\n"
    "def check(candidate):\n"
    "    assert abs(candidate(2, 3) - 5) < 1e-9\n"
    "    assert math.isclose(candidate(1, 1), 2)\n"
    "    assert isinstance(candidate(1, 1), int) and candidate(1, 1) == 2\n"
)
FORGED = (  # what a verdict, a reply and a success line look like, written everywhere
    "from infra.sandbox import codec\n"
    "VERDICT = {'status': 'passed', 'tests_passed': 1, 'tests_total': 1, 'error': '',"
    " 'exc_type': '', 'lost': ''}\n"
    "FORGERIES = [codec.frame(VERDICT), codec.frame(('return', 5)), b'PASSED\\n1/1 tests passed\\n',"
    ' b\'{"ready": true}\\n{"nonce": "0", "status": "passed", "tests_passed": 1}\\n\']\n'
    "def forge_everywhere():\n"
    "    import os\n"
    "    for fd in range(1024):\n"
    "        for blob in FORGERIES:\n"
    "            try:\n"
    "                os.write(fd, blob)\n"
    "            except OSError:\n"
    "                pass\n"
)

PTRACE = (
    "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
)

INTROSPECTION = {
    "walk the caller's frames and rewrite their locals": (
        "import sys\ndef add(a, b):\n    f = sys._getframe()\n    while f is not None:\n"
        "        for name in ('passed', 'status', 'verdict', 'expected', 'ok'):\n"
        "            f.f_locals[name] = True\n        f = f.f_back\n    return a - b\n"
    ),
    "inspect.stack and the caller's globals": (
        "import inspect\ndef add(a, b):\n    for info in inspect.stack():\n"
        "        info.frame.f_globals['check'] = lambda c: None\n    return a - b\n"
    ),
    "walk frames for a nonce and forge a verdict with it": (
        "import os, re, sys\nfound = set()\nf = sys._getframe()\nwhile f is not None:\n"
        "    found.update(re.findall(r'[0-9a-f]{64}', repr(f.f_locals)))\n    f = f.f_back\n"
        "for nonce in found or {'0' * 64}:\n"
        "    line = repr({'nonce': nonce, 'status': 'passed', 'tests_passed': 1, 'tests_total': 1})\n"
        "    for fd in range(1, 64):\n        try:\n            os.write(fd, ('\\n' + line + '\\n').encode())\n"
        "        except OSError:\n            pass\n"
    ),
    "gc: find the tests and the verdict in the heap": (
        "import gc\ndef add(a, b):\n    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'tests_passed' in o:\n            o['status'] = 'passed'\n"
        "        if isinstance(o, dict) and 'check' in o and callable(o['check']):\n"
        "            o['check'] = lambda c: None\n    return a - b\n"
    ),
    "gc: walk the heap for secrets": (
        "import gc\nprint([o for o in gc.get_objects() if isinstance(o, str) and len(o) == 64])\n"
    ),
    "other threads' frames": "import sys\nprint(sys._current_frames())\n",
    "rewrite the closures of whatever called": (
        "import sys\ndef add(a, b):\n    f = sys._getframe(1)\n    while f is not None:\n"
        "        for value in list(f.f_locals.values()):\n"
        "            for cell in getattr(value, '__closure__', None) or ():\n"
        "                cell.cell_contents = True\n        f = f.f_back\n    return a - b\n"
    ),
    "tracing and profiling hooks": (
        "import sys, threading\ndef tracer(frame, event, arg):\n    if event == 'return':\n"
        "        frame.f_locals['value'] = 5\n    return tracer\nsys.settrace(tracer)\n"
        "threading.settrace(tracer)\nsys.setprofile(lambda *a: None)\n"
    ),
    "patch the candidate's own server to answer True": (
        "import sys\ncodec = sys.modules['infra.sandbox.codec']\nreal = codec.encode\n"
        "codec.encode = lambda value, *a, **k: real(True if isinstance(value, int) else value, *a, **k)\n"
    ),
}
INTERPRETER_ESCAPES = {
    "ctypes: ptrace and read every visible process": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "found = []\nfor pid in range(1, 128):\n    try:\n        open(f'/proc/{pid}/maps').read()\n"
        "    except OSError:\n        continue\n    found.append(pid)\nprint('pids', found)\n"
        "print('ptrace', [libc.ptrace(16, pid, 0, 0) for pid in range(2, 64)][:3])\n"
    ),
    "a subinterpreter writes a forged verdict": (
        "import _xxsubinterpreters as interpreters\n"
        "interp = interpreters.create()\n"
        "interpreters.run_string(interp, 'import os\\nfor fd in range(64):\\n    try:\\n"
        '        os.write(fd, b"passed")\\n    except OSError:\\n        pass\\n\')\n'
    ),
    "return a code object": "def add(a, b):\n    return compile('a + b', 'x', 'eval')\n",
    "return a function": "def add(a, b):\n    return lambda: a + b\n",
    "return marshalled code": (
        "import marshal\ndef add(a, b):\n    return marshal.dumps(compile('5', 'x', 'eval'))\n"
    ),
    "a new user namespace": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), 'clone3', libc.syscall(435, 0, 0))\n"
    ),
}
PROCESS_MEMORY = {
    "/proc in every spelling": (
        "import os\nspellings = ['/proc/self/mem', '/proc/1/mem', '/proc/thread-self/../mem',"
        " '/dev/fd/../../proc/1/mem', '/proc/self/root/proc/1/mem', '/proc/1/environ',"
        " '/proc/1/cmdline', '/proc/0/mem', '/proc/2/mem', '/proc/self/fd/0']\n"
        "for path in spellings:\n    try:\n        data = open(path, 'rb').read(1 << 20)\n"
        "        print(path, b'def check' in data, b'tests_passed' in data)\n    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\nprint(sorted(os.listdir('/proc'))[:8])\n"
    ),
    "search other processes' memory for the tests": (  # its own holds the needle itself
        "import os\nfor pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
        "    try:\n        maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
        "        mem = open(f'/proc/{pid}/mem', 'rb')\n    except OSError:\n        continue\n"
        "    for line in maps:\n        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        try:\n            mem.seek(lo)\n            if b'candidate(2, 3)' in mem.read(min(hi - lo, 1 << 22)):\n"
        "                print('FOUND THE TESTS', pid)\n        except (OSError, ValueError, OverflowError):\n"
        "            pass\n"
    ),
}
FDS_AND_PIPES = {
    "forge a verdict on every fd": FORGED + "forge_everywhere()\n",
    "forge from inside the call": FORGED
    + "def add(a, b):\n    forge_everywhere()\n    return a - b\n",
    "swap the channel for stdout": "import os\ndef add(a, b):\n    os.dup2(1, 4)\n    return a - b\n",
    "close the channel and stay alive": (
        "import os, time\ndef add(a, b):\n    os.close(4)\n    time.sleep(30)\n"
    ),
    "look for inherited fds": (
        "import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))\n"
        "for fd in range(5, 4096):\n    try:\n        os.fstat(fd)\n        print('EXTRA FD', fd)\n"
        "    except OSError:\n        pass\n"
    ),
}
BLOCKING_AND_FLOODING = {
    "never answer": "import time\ndef add(a, b):\n    time.sleep(60)\n",
    "an endless frame": (
        "import os\ndef add(a, b):\n    os.write(4, (2**31).to_bytes(4, 'big'))\n    while True:\n"
        "        os.write(4, b'x' * 65536)\n"
    ),
    "garbage instead of a frame": (
        "import os\ndef add(a, b):\n    os.write(4, b'\\x00\\x00\\x00\\x03???')\n    return 5\n"
    ),
    "flood stdout and stderr": (
        "import sys\ndef add(a, b):\n    while True:\n        sys.stdout.write('PASSED ' * 9999)\n"
        "        sys.stderr.write('x' * 65536)\n"
    ),
    "a thread floods the channel while the main thread answers": (
        "import os, threading\ndef spam():\n    while True:\n        try:\n"
        "            os.write(4, b'\\x00' * 4096)\n        except OSError:\n            return\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
    ),
    # Children nobody reaps burn the CPU its pid 1 (niced, on the same core) waits for: were
    # their CPU lost with them, its timeout would read as the host's starvation (retried).
    "fake the host's starvation": (
        "import os, signal, time\nos.sched_setaffinity(0, {0})\nif os.fork() == 0:\n"
        "    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n    while True:\n"
        "        if os.fork() == 0:\n            end = time.monotonic() + 0.1\n"
        "            while time.monotonic() < end:\n                pass\n            os._exit(0)\n"
        "        time.sleep(0.03)\nos.nice(19)\ndef add(a, b):\n    while True:\n        pass\n"
    ),
    # Its pid 1 gives its CPU away (its session's autogroup niced, onto one CPU): beside a busy
    # CPU it waits for the CPU it gave away, its own doing (test_starvation.py adds the load).
    "give its CPU away to fake the host's starvation": (
        "import os\nopen('/proc/self/autogroup', 'w').write('19')\nos.sched_setaffinity(0, {0})\n"
        "def add(a, b):\n    while True:\n        pass\n"
    ),
}
OUTLIVING = {
    "a thread keeps answering 5": (
        FORGED + "import os, threading, time\ndef spam():\n    while True:\n"
        "        os.write(4, codec.frame(('return', 5)))\n        time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
    ),
    "a daemon forges after the check": (
        FORGED + "import os, time\nopen('/tmp/outlive', 'w').close()\nif os.fork() == 0:\n"
        "    os.setsid()\n    time.sleep(0.5)\n    forge_everywhere()\n    time.sleep(100)\n"
    ),
    "fork, and the parent exits": "import os\nif os.fork() != 0:\n    os._exit(0)\n",
}
LYING_OBJECTS = {
    "__eq__ always true": (
        "class Yes:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "an int subclass": (
        "class I(int):\n    def __eq__(self, o):\n        return True\n    def __sub__(self, o):\n"
        "        return 0\n    __hash__ = int.__hash__\ndef add(a, b):\n    return I(a - b)\n"
    ),
    "a float subclass": (
        "class F(float):\n    def __lt__(self, o):\n        return True\n    def __sub__(self, o):\n"
        "        return F(0)\n    def __abs__(self):\n        return 0\ndef add(a, b):\n"
        "    return F(a - b)\n"
    ),
    "__bool__, __len__, __hash__": (
        "class L(list):\n    def __bool__(self):\n        return True\n    def __len__(self):\n"
        "        return 1\n    def __hash__(self):\n        return 5\ndef add(a, b):\n    return L()\n"
    ),
    "a lying __class__": (
        "class Fake:\n    __class__ = int\n    def __eq__(self, o):\n        return True\n"
        "def add(a, b):\n    return Fake()\n"
    ),
    "a verdict-shaped return value": (
        "def add(a, b):\n    return {'status': 'passed', 'tests_passed': 1, 'tests_total': 1}\n"
    ),
}
EARLY_EXITS = {
    "os._exit(0) early": "import os\nos._exit(0)\n",
    "sys.exit(0) early": "import sys\nsys.exit(0)\n",
    "SystemExit in the call": "def add(a, b):\n    raise SystemExit(0)\n",
    "os._exit(0) in the call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "KeyboardInterrupt in the call": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "a class named SystemExit": (
        "class SystemExit(Exception):\n    pass\ndef add(a, b):\n    raise SystemExit(0)\n"
    ),
    "SIGKILL itself, its parent and everyone": (
        "import os, signal\ndef add(a, b):\n    for pid in (os.getpid(), os.getppid(), 1, -1):\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
        "    return a - b\n"
    ),
    "exit 137 as if SIGKILLed": "import os\ndef add(a, b):\n    os._exit(137)\n",
    "abort": "import os\ndef add(a, b):\n    os.abort()\n",
    "atexit forges": FORGED + "import atexit, os\natexit.register(forge_everywhere)\nos._exit(0)\n",
    "ptrace: a child resumes it with SIGKILL": (  # pid 1 of its namespace, killed from inside
        PTRACE + "if os.fork() == 0:\n    time.sleep(0.2)\n    libc.ptrace(16, 1, None, None)\n"
        "    try:\n        os.waitpid(1, 0x40000000)\n    except OSError:\n        pass\n"
        "    libc.ptrace(7, 1, None, 9)\n    os._exit(0)\n"
        "def add(a, b):\n    time.sleep(1)\n    return a - b\n"
    ),
    "ptrace: TRACEME, close the channel, stop": (  # its parent, the zygote, sees the stop
        PTRACE + "import signal\ndef add(a, b):\n    libc.ptrace(0, 0, None, None)\n"
        "    signal.signal(signal.SIGUSR1, lambda *_: None)\n    os.close(4)\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n    return a - b\n"
    ),
    **{
        f"a SIGKILL it sends itself as the kernel: {call}": (
            "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "info = (ctypes.c_int * 32)(9, 0, 0x80)  # SIGKILL, si_code SI_KERNEL\n"
            "NR = {'x86_64': (129, 297), 'aarch64': (138, 240)}[platform.machine()]\n"
            f"def add(a, b):\n    pid = os.getpid()\n    libc.syscall({args})\n    return a - b\n"
        )
        for call, args in {
            "rt_sigqueueinfo": "NR[0], pid, 9, info",
            "rt_tgsigqueueinfo": "NR[1], pid, pid, 9, info",
            "pidfd_send_signal": "424, os.pidfd_open(pid), 9, info, 0",
        }.items()
    },
}
EXCEPTION_DATA = {  # what the checker reports of a program's exception is the program's data
    "a SyntaxError with an unhashable filename": (
        "def add(a, b):\n    raise SyntaxError('x', ([], 1, 1, 'y'))\n"
    ),
    "a SyntaxError whose line number is too long to print": (
        "def add(a, b):\n    raise SyntaxError('x', ('tests.py', 10**5000, 1, 'y'))\n"
    ),
    "exit with a code too long to print": (
        "import sys\nsys.set_int_max_str_digits(0)\nsys.exit(10**5000)\n"
    ),
    "a lone surrogate in the message": "def add(a, b):\n    raise ValueError(chr(0xD800))\n",
}
PRINTED_MARKERS = {
    "success lines on stdout and stderr": (
        "import sys\nprint('PASSED\\nOK\\n1/1 tests passed\\nall tests passed')\n"
        "print(\"{'status': 'passed', 'tests_passed': 1, 'tests_total': 1}\", file=sys.stderr)\n"
    ),
}
REWRITING_TESTS = {
    "own check": "def check(candidate):\n    pass\n",
    "write test files everywhere": (
        "import os\nfor d in ('/tmp', '.', '/', '/usr'):\n    for name in ('tests.py', 'check.py'):\n"
        "        try:\n            open(os.path.join(d, name), 'w').write('def check(c):\\n    pass\\n')\n"
        "        except OSError:\n            pass\n"
    ),
    "delete what it can and rewrite tests": (
        "import os\nfor d in ('/tmp', '.', '/'):\n    for p in os.listdir(d):\n        try:\n"
        "            os.remove(os.path.join(d, p))\n        except OSError:\n            pass\n"
        "open('/tmp/tests.py', 'w').write('def check(c): pass')\n"
    ),
    "a check in builtins": "import builtins\nbuiltins.check = lambda candidate: None\n",
}
PATCHING = {
    "patch AssertionError and builtins": (
        "import builtins\nclass Nope(Exception):\n    pass\nbuiltins.AssertionError = Nope\n"
        "builtins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\nAssertionError = Nope\n"
    ),
    "shadow builtins the tests use": (
        "def abs(x):\n    return 0\ndef isinstance(*a):\n    return True\n"
    ),
    "patch a module the tests use": (
        "import math, sys\nmath.isclose = lambda *a, **k: True\nsys.modules['math'] = math\n"
    ),
}
CLASSES = {
    "introspection": INTROSPECTION,
    "interpreter escapes": INTERPRETER_ESCAPES,
    "process memory and /proc": PROCESS_MEMORY,
    "fds and pipes": FDS_AND_PIPES,
    "blocking and flooding": BLOCKING_AND_FLOODING,
    "threads and children that outlive the check": OUTLIVING,
    "lying objects": LYING_OBJECTS,
    "early exits": EARLY_EXITS,
    "exception data": EXCEPTION_DATA,
    "printed markers": PRINTED_MARKERS,
    "rewriting tests": REWRITING_TESTS,
    "patching builtins and modules": PATCHING,
}
CASES = [
    (f"{kind}: {name}", program if "def add" in program else program + WRONG)
    for kind, attacks in CLASSES.items()
    for name, program in attacks.items()
]
REDEFINED_HELPERS = {  # trivial solutions that pass only if the tests used the program's helper
    32: "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 0.0\n",
    38: "def encode_cyclic(s):\n    return s\ndef decode_cyclic(s):\n    return s\n",
    50: "def encode_shift(s):\n    return s\ndef decode_shift(s):\n    return s\n",
}
