"""How `tempered runs rm` deletes one run (`workers/cli/runs.py` checks first that it may):
in an order that a rerun of the command finishes, whenever it stopped.

    line = remove_run(store, settings.policy_cache, "exp1")   # "deleted run exp1: ..."

First `removed/<run>.json` (the id is never used again, `infra/keys.py`), then the run's
evaluations (`runs/<run>-eval-.../`), then its locally cached policy versions, and the run's
own `runs/<run>/` last; under each prefix the incomplete multipart uploads are aborted before
its objects go (a worker killed mid-upload leaves its parts stored, listed by no list of keys).
A rerun of `rm` takes a run with a removal record as one to finish (`infra.run_ids`; other
commands call it unknown) and deletes what is left. Deleting the run's prefix first left a rerun
stopped at "unknown run", with the evaluations and cached policies kept for good. An S3 error on
the way names what was done already. It does not ask whether the run runs (the caller did),
but it refuses (ValueError, before anything is deleted) a run whose policy versions a live
reader marks (`runs_busy.live_readers`: a `tempered eval --run RUN` before its first task's
workflow exists, which no workflow tells of): its marker expires in at most `READER_TTL_S`
after its reader is gone.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

from contracts.names import evaluates
from infra import keys
from infra.policy_cache import forget_run
from infra.run_ids import removal_record
from infra.storage import ObjectExists, ObjectStore, StorageError
from workers.cli.runs_busy import live_readers


def refuse_read(store: ObjectStore, run: str) -> None:
    """ValueError where a live reader reads `run` (`runs_busy.live_readers`)."""
    if readers := live_readers(store, run):
        raise ValueError(
            f"run {run} is read: {'; '.join(readers)}; nothing deleted (let the reader finish; "
            "one gone without a word keeps it only until then)"
        )


def remove_run(store: ObjectStore, cache_dir: Path, run: str) -> str:
    """Delete `run`'s objects, its evaluations' and its policy versions in `cache_dir`; the
    line that says what went. A StorageError says what was deleted before it; a ValueError,
    that a live reader reads the run (nothing deleted)."""
    refuse_read(store, run)
    evals = [
        prefix
        for prefix in store.list_prefixes(keys.RUNS_PREFIX)
        if evaluates(prefix.removeprefix(keys.RUNS_PREFIX).rstrip("/"), run)
    ]
    done: list[str] = []
    record_key = keys.removed_run_key(run)
    try:
        # asked, not told by the write: a create-only write of the same bytes (a rerun in the
        # same second) succeeds, and the rerun took itself for the first removal
        removed_before = removal_record(store, run) is not None
        if not removed_before:
            when = datetime.now(UTC).isoformat(timespec="seconds")
            with contextlib.suppress(ObjectExists):  # another `rm` wrote it meanwhile
                store.put_json(record_key, {"run_id": run, "removed_at": when}, create_only=True)
        done.append(f"{'kept' if removed_before else 'wrote'} {record_key}")
        deleted = aborted = 0
        for prefix in evals:
            aborted += store.abort_uploads(prefix)
            deleted += store.delete_prefix(prefix)
            done.append(f"deleted evaluation {prefix.removeprefix(keys.RUNS_PREFIX).rstrip('/')}")
        forget_run(cache_dir, run)
        done.append("deleted its cached policies")
        aborted += store.abort_uploads(keys.run_prefix(run))
        deleted += store.delete_prefix(keys.run_prefix(run))  # last: a rerun finds the run
    except StorageError as exc:
        raise StorageError(
            f"{exc}; rm of run {run} stopped; done: {', '.join(done) or 'nothing'}; run "
            f"`tempered runs rm {run}` again to finish it"
        ) from None
    if deleted == aborted == 0 and removed_before:
        return f"run {run} was removed already ({record_key}): nothing left of it"
    uploads = f", {aborted} incomplete uploads" if aborted else ""
    return (
        f"deleted run {run}: {deleted} objects ({len(evals)} evaluations){uploads}, cached policies"
    )
