"""Whether a new `tempered train` run would start beside training runs that run already.

    check_none_running(settings)        # RunsRunning: names each, how to follow it, --alongside

Ctrl-C only detaches a `train` (its run goes on in the background workers), so rerunning
`make train` or `tempered train` after it started a second run beside the first, which then
shared the machine's cores with it, and said nothing. `tempered train` asks Temporal (a
visibility query, `running_run_ids`) once the stack answers, before it checks the run id or
starts a worker, and refuses unless `--alongside`. Every run on the settings' namespace counts,
whoever started it. Not asked by `--dry-run`, which starts no stack. A Temporal that cannot
list runs (a key that may start workflows but not list them, a server without the status
filter) checks nothing, with a warning: the run starts as it did before the check.

Not covered: two `train`s started within visibility's lag of each other both pass the check.
"""

from __future__ import annotations

import asyncio
import sys

from temporalio.service import RPCError

from infra.settings import Settings
from workers.cli.stack import running_run_ids
from workers.runtime import connect, quiet_runtime


class RunsRunning(ValueError):
    """Training runs run on the stack a new run would start on (exit 2: nothing started)."""

    def __init__(self, running: list[str]):
        why = "an interrupted `tempered train` detaches, and its run goes on"
        beside = "or start this run beside {} with `tempered train --alongside`"
        if len(running) == 1:
            (run,) = running
            text = (
                f"training run {run} runs ({why}): follow it with `tempered train --attach "
                f"{run}`, stop it with `tempered stop {run}`, {beside.format('it')}"
            )
        else:
            follow = " or ".join(f"`tempered train --attach {run}`" for run in running)
            text = (
                f"{len(running)} training runs run: {', '.join(running)} ({why}): follow one "
                f"with {follow}, stop one with `tempered stop RUN`, {beside.format('them')}"
            )
        super().__init__(text)


def check_none_running(settings: Settings) -> None:
    """RunsRunning when training runs run on the settings' Temporal, which answers."""

    async def ask() -> list[str]:
        return await running_run_ids(await connect(settings, runtime=quiet_runtime()))

    try:
        running = asyncio.run(ask())
    except RPCError as exc:  # it answered (the stack is up) but would not list: not checked
        print(
            f"warning: not checked whether training runs run already (Temporal would not list "
            f"them: {exc.message or exc}); `--alongside` skips this check",
            file=sys.stderr,
        )
        return
    if running:
        raise RunsRunning(running)
