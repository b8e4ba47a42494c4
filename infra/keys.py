"""The object-store key layout, in one place: no other module spells a key.

runs/<run>/tasks/<task>/s<sample>/turn-<k>/completion.json   text, token ids, logprobs
runs/<run>/tasks/<task>/s<sample>/turn-<k>/code.py           program extracted from it
runs/<run>/tasks/<task>/s<sample>/turn-<k>/attempt-<a>/result.json   ExecutionResult,
runs/<run>/tasks/<task>/s<sample>/turn-<k>/attempt-<a>/stdout.txt|stderr.txt
                         written once per activity attempt, so an orphaned attempt that
                         finishes late never changes what a later attempt's refs name
runs/<run>/trajectories/<task>--s<sample>.json               Trajectory, written once
runs/<run>/rewards/<grader>/<task>--s<sample>.json           regrade records, written once
runs/<run>/policy/blobs/<sha256>                             a file of some policy version,
                         content-addressed: versions that share a weights shard share its blob
runs/<run>/policy/v<version>/manifest.json                   the version's files; written
                         last: the version is complete
runs/<run>/policy/latest.json                                pointer, written after manifest
runs/<run>/policy/readers/<reader>.json                      a reader outside the run (`tempered
                         eval`) reads a version: the run's prunes keep it (infra/retention.py)
runs/<run>/learner/step-<step>.json                          ack: trajectories consumed
runs/<run>/learner/ledger-<segment>.json                     task ids one continue-as-new
                                                             segment of the learner took
runs/<run>/learner/step-<step>-groups-<sha256>.json          a part of a step's groups, where
                         they would pass its `train_step` payload (workflows/learner_request.py)
runs/<run>/run.json                                          TrainingRunInput of the run
runs/<run>/tasks/<task>/s<sample>/turn-<k>/observation-<sha>.txt   a tool call's result text
runs/<run>/tasks/<task>/s<sample>/verdict-<sha>.json         the verifier's ExecutionResult
                         both named by a prefix of their content's sha256, so a step or a
                         check run again (on another worker) never overwrites what a ref names
removed/<run>.json                                           `tempered runs rm`'s record:
                         the id is not used again (machines that served the run may still
                         cache its policies and ledger under it)
runs/<run>/snapshots/<task>--s<sample>/<sha>.json.z          a snapshot of an episode's
                         workspace, named by its digest (infra/environments/snapshot_chain.py):
                         the run's retention deletes the folder once the episode's trajectory
                         is written, and every folder once the run has finished
workspaces/trees/<sha[:2]>/<sha>.json.z                      a tree (snapshots, initial
                         workspaces, hidden tests; snapshots whose episode no caller named):
                         its manifest and the contents new in it
workspaces/packs/<sha[:2]>/<sha>.z                           file contents of trees stored
                         before contents moved into the tree's object (read only); both
                         content-addressed, shared by every run (infra/environments/tree.py)
"""

import re

from contracts.common import is_identifier

RUNS_PREFIX = "runs/"
_POLICY_DIR = re.compile(r"/policy/v(\d+)/$")


def run_prefix(run: str) -> str:
    """The prefix of everything `run` stored. An id that is not one (`""`, `a/b`) is refused:
    `runs/` + `""` + `/` reads as `runs/` in S3, the prefix of every run."""
    if not is_identifier(run):
        raise ValueError(f"{run!r} is not a run id")
    return f"{RUNS_PREFIX}{run}/"


def tasks_prefix(run: str) -> str:
    return f"runs/{run}/tasks/"


def turn_prefix(run: str, task: str, sample: int, turn: int) -> str:
    return f"runs/{run}/tasks/{task}/s{sample}/turn-{turn}/"


def turn_key(run: str, task: str, sample: int, turn: int, name: str) -> str:
    return turn_prefix(run, task, sample, turn) + name


def attempt_key(run: str, task: str, sample: int, turn: int, attempt: int, name: str) -> str:
    return f"{turn_prefix(run, task, sample, turn)}attempt-{attempt}/{name}"


def trajectories_prefix(run: str) -> str:
    return f"runs/{run}/trajectories/"


def episode_name(task: str, sample: int) -> str:
    """How keys name one episode of a run: `<task>--s<sample>`."""
    return f"{task}--s{sample}"


def episode_of(name: str) -> tuple[str, int] | None:
    """The task and sample an `episode_name` names, None for any other name. The sample is
    what follows the last `--s` (a task id may hold `--s` itself: `x--s1--s0` is task `x--s1`'s
    sample 0), written as `episode_name` writes it (digits, no leading zero)."""
    task, sep, sample = name.rpartition("--s")
    if not (sep and task and sample.isascii() and sample.isdigit()):
        return None
    return (task, int(sample)) if str(int(sample)) == sample else None


def trajectory_key(run: str, task: str, sample: int) -> str:
    return f"{trajectories_prefix(run)}{episode_name(task, sample)}.json"


def task_trajectories_prefix(run: str, task: str) -> str:
    """The prefix of every trajectory of `task`'s episodes; also of a task whose id extends
    `<task>--s` (`trajectory_episode` and `episode_of` tell them apart)."""
    return f"{trajectories_prefix(run)}{episode_name(task, 0).removesuffix('0')}"


def trajectory_episode(run: str, key: str) -> str | None:
    """The episode (`episode_name`) whose trajectory `key` is, None for another key."""
    name = key.removeprefix(trajectories_prefix(run))
    return name.removesuffix(".json") if name != key and name.endswith(".json") else None


def rewards_prefix(run: str, grader: str | None = None) -> str:
    """Every grader's records of `run`, or one grader's."""
    return f"runs/{run}/rewards/" + (f"{grader}/" if grader else "")


def reward_key(run: str, grader: str, task: str, sample: int) -> str:
    return f"{rewards_prefix(run, grader)}{episode_name(task, sample)}.json"


def policies_prefix(run: str) -> str:
    return f"runs/{run}/policy/"


def policy_version_of(prefix: str) -> int | None:
    """The version a `policy_prefix` names (None for any other prefix)."""
    match = _POLICY_DIR.search(prefix)
    return int(match.group(1)) if match else None


def policy_prefix(run: str, version: int) -> str:
    return f"{policies_prefix(run)}v{version:06d}/"


def policy_manifest_key(run: str, version: int) -> str:
    return policy_prefix(run, version) + "manifest.json"


def policy_blob_key(run: str, sha256: str) -> str:
    return f"{policies_prefix(run)}blobs/{sha256}"


def latest_policy_key(run: str) -> str:
    return f"{policies_prefix(run)}latest.json"


def policy_readers_prefix(run: str) -> str:
    return f"{policies_prefix(run)}readers/"


def policy_reader_key(run: str, reader: str) -> str:
    return f"{policy_readers_prefix(run)}{reader}.json"


def learner_prefix(run: str) -> str:
    return f"runs/{run}/learner/"


def learner_ack_key(run: str, step: int) -> str:
    return f"{learner_prefix(run)}step-{step:06d}.json"


def learner_step_groups_key(run: str, step: int, sha256: str) -> str:
    """One part of step `step`'s groups (`contracts.learner.StepGroups`), stored when they would
    pass a payload in its `train_step` request; named by its digest, so a step asked again with
    other groups (a reset learner) never meets a part of the first."""
    return f"{learner_prefix(run)}step-{step:06d}-groups-{sha256}.json"


def learner_step_groups_of(run: str, key: str) -> int | None:
    """The step whose groups `key` is a part of (a `learner_step_groups_key` of `run`), None for
    any other key (the learner's acks and ledger beside the parts included)."""
    name = key.removeprefix(learner_prefix(run))
    match = re.fullmatch(r"step-(\d+)-groups-[0-9a-f]{64}\.json", name)
    return int(match.group(1)) if match and name != key else None


def learner_ledger_key(run: str, segment: int) -> str:
    return f"{learner_prefix(run)}ledger-{segment:06d}.json"


def learner_ledger_prefix(run: str) -> str:
    return f"{learner_prefix(run)}ledger-"


def run_record_key(run: str) -> str:
    return f"runs/{run}/run.json"


def removed_run_key(run: str) -> str:
    return f"removed/{run}.json"


def observation_key(run: str, task: str, sample: int, step: int, digest: str) -> str:
    return turn_key(run, task, sample, step, f"observation-{digest[:16]}.txt")


def verdict_key(run: str, task: str, sample: int, digest: str) -> str:
    return f"runs/{run}/tasks/{task}/s{sample}/verdict-{digest[:16]}.json"


def pack_key(digest: str) -> str:
    return f"workspaces/packs/{digest[:2]}/{digest}.z"


def tree_key(digest: str) -> str:
    return f"workspaces/trees/{digest[:2]}/{digest}.json.z"


def snapshots_prefix(run: str) -> str:
    return f"runs/{run}/snapshots/"


def episode_snapshots_prefix(run: str, task: str, sample: int) -> str:
    """The folder of one episode's snapshots."""
    return f"{snapshots_prefix(run)}{episode_name(task, sample)}/"


def snapshot_key(folder: str, digest: str) -> str:
    """A snapshot in `folder` (`episode_snapshots_prefix`), named by its digest."""
    return f"{folder}{digest}.json.z"


def snapshot_episode(run: str, key: str) -> str | None:
    """The episode (`episode_name`) whose snapshot `key` is, None for another key."""
    name, slash, _ = key.removeprefix(snapshots_prefix(run)).partition("/")
    return name if slash and key.startswith(snapshots_prefix(run)) else None
