"""The pending groups a `LearnerWorkflow` segment hands on: inline, or by reference past a payload.

    await carry(state)                  # before the state leaves the segment: its continue-as-new
                                        # input, or its `learner_done` and result at its end
    seen = await read_carried(state)    # first thing in a segment: the groups it was handed back

The learner's pending groups are bounded in number (by the run's flow control), not in bytes: at
G = 256 a group is ~45 KB of refs, and 63 of a 64-group step are ~2.8 MB. A segment that
continued as new with them (no whole batch pending, so `learner.CARRY_PATCH` did not train
first) was refused its input (TMPRL1103) on every retry of the workflow task, and one that ended
at `max_steps` with them left over was refused its `learner_done` to the run the same way (and
would have been its result): the learner RUNNING for ever.

So where the pending groups pass `SIGNAL_BYTES` (the one bound on the groups one payload
carries, workflows/step_slots.py) they are stored in parts by `store_step_groups`, as a step's
groups are (`learner_request.store_groups`, a part a workflow task: a transaction of the
server's holds at most 4 MiB), and the state names the parts in
`LearnerInput.pending_parts` instead (`CARRY_PARTS_PATCH`, asked only then): ~200 bytes a part.
Groups signalled while they are stored stay inline, after them, where they are within
`SIGNAL_BYTES`; past it they are stored too, round after round (three ~0.9 MB signals during a
carry's stores were refused the same way).

Rounds after the first, by release: b0cf1ee made none (what came meanwhile went inline, within a
payload up to 2 MiB: `SIGNAL_BYTES` is half of it); cc5559e made them with no marker of their own
(it asked `CARRY_PARTS_PATCH` every round, and `patched` answers a patch once a run); since, each
is behind `CARRY_AGAIN_PATCH`, asked first (a run writes its marker as before). Where the caller
says the run may be cc5559e's (`unmarked`), a later round is made without that marker too: where
it answered `CARRY_LAST_PATCH` True before carrying (a marker only cc5559e and later write: their
ending, and a segment from before `LEDGER_FIRST_PATCH` continuing as new; b0cf1ee's histories
there lack it, and make one round), and where no marker tells the two apart (below).
Unsupported, for want of a marker: (1) a segment since `LEDGER_FIRST_PATCH` continuing as new,
which asks `CARRY_LAST_PATCH` nowhere, so that b0cf1ee's and cc5559e's histories mark the same
patches up to its carry: cc5559e's, the release before, replay; a b0cf1ee history that went on to
its continue-as-new with the groups signalled during its stores past `SIGNAL_BYTES` inline fails
(TMPRL1100), as it did on cc5559e; (2) a history b0cf1ee recorded up to its carry whose later
round cc5559e made live (its ending, or a continue-as-new, without `CARRY_LAST_PATCH`'s marker):
it replays as b0cf1ee's, one round, and fails.

The next segment reads the parts back (`load_step_groups`, a part a workflow task, each within a
payload) before anything else and puts their groups first, dropping a copy of one re-sent
meanwhile; its history holds them once more, as an inline input's did. An input that names no
parts (every one before the patch) asks for nothing, so reading back needs no patch of its own. A
final state's parts stay in the store under the run's prefix (the run reads nothing of a
learner's `pending`).
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.learner import LearnerInput, StepGroups, TrajectoryGroup
    from contracts.names import Activity
    from workflows.activity_options import activity_options
    from workflows.step_slots import SIGNAL_BYTES

# not passed through: it builds contracts from the workflow's state (see workflows/learner.py)
from workflows.learner_request import groups_bytes, store_groups

CARRY_LAST_PATCH = "tempered-learner-carries-after-its-last-ledger-write"
"""Marks runs (workflows/learner.py) that, ending (or, before its `LEDGER_FIRST_PATCH`,
continuing as new), write their ledger first and carry last, signal `learner_done` with a copy
of the state as carried, and carry again what was signalled meanwhile, for the result. Before,
they carried first: groups signalled during the write, or during the signal's retries (each sent
the state as it had grown), stayed inline, and three ~0.9 MB signals were refused (TMPRL1103) on
every retry: the learner RUNNING for ever."""
CARRY_PARTS_PATCH = "tempered-learner-carries-groups-by-reference"
"""Marks runs whose state, handed on (continue-as-new) or reported (`learner_done`, result) with
pending groups past `SIGNAL_BYTES`, names them in stored parts. Before, it carried them inline:
past 2 MiB, refused on every retry."""
CARRY_AGAIN_PATCH = "tempered-learner-carries-groups-signalled-while-carrying"
"""Marks runs whose carry, finding the groups signalled during its stores past `SIGNAL_BYTES`,
stores them too, round after round. Before, they stayed inline: past 2 MiB, refused on every
retry."""


async def carry(state: LearnerInput, *, unmarked: bool = False) -> None:
    """Store `state.pending` in parts and name them in `state.pending_parts` while the groups pass
    `SIGNAL_BYTES` (`CARRY_PARTS_PATCH`, asked only then): again for those signalled meanwhile
    (`CARRY_AGAIN_PATCH`, asked only then), also without its marker where `unmarked` (the run
    may be cc5559e's, whose later rounds have none)."""
    patch = CARRY_PARTS_PATCH
    while groups_bytes(state.pending) > SIGNAL_BYTES and (
        workflow.patched(patch) or (unmarked and patch == CARRY_AGAIN_PATCH)
    ):
        patch = CARRY_AGAIN_PATCH  # memoized: a first round's answer says nothing of a second
        pending = list(state.pending)  # as they stand: a signal may add more while they are stored
        refs = await store_groups(state, pending)
        state.pending_parts.extend(refs)  # after any still named: the older groups
        del state.pending[: len(pending)]


async def read_carried(state: LearnerInput) -> set[str]:
    """Read back the groups `state.pending_parts` names, put them before `state.pending` (less a
    copy of any), name no parts: their task ids. Nothing to do where it names none."""
    refs = list(state.pending_parts)
    if not refs:
        return set()
    options = activity_options(Activity.LOAD_STEP_GROUPS, state.heartbeat_timeout_s)
    carried: list[TrajectoryGroup] = []
    for ref in refs:  # one a workflow task: a transaction holds one part's result
        part = await workflow.execute_activity(
            Activity.LOAD_STEP_GROUPS.value, ref, result_type=StepGroups, **options
        )
        carried.extend(part.groups)
    ids = {group.task_id for group in carried}
    state.pending = carried + [g for g in state.pending if g.task_id not in ids]
    state.pending_parts = []
    return ids
