"""Environments an agent acts in: reset, tools, step, verify (base.py), one file each.

    code.py        write one function; the action is the answer, the observation its test log
    workspace.py   a directory the agent works in with bash, read_file, write_file, submit

With their parts: tree.py (the snapshot format), snapshots.py (trees on disk and in the store;
packing.py: which objects a commit merges), sessions.py (a worker's sessions and TTL),
dead_workers.py (sweeping a dead worker's), tools.py (the workspace's tools and their
arguments), paths.py (agent paths kept inside the workspace), checks.py (hidden tests in a
fresh verifier sandbox). The activities serving them
are activities/environment.py (workspace) and activities/sandbox.py (`execute`, code).
"""
