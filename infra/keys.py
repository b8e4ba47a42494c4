"""The object-store key layout, in one place.

    runs/<run>/tasks/<task>/s<sample>/turn-<k>/completion.json   text, token ids, logprobs
    runs/<run>/tasks/<task>/s<sample>/turn-<k>/code.py           program extracted from it
    runs/<run>/tasks/<task>/s<sample>/turn-<k>/result.json       ExecutionResult
    runs/<run>/tasks/<task>/s<sample>/turn-<k>/stdout.txt|stderr.txt
    runs/<run>/trajectories/<task>--s<sample>.json               Trajectory, written once
    runs/<run>/rewards/<grader>/<task>--s<sample>.json           regrade records, written once
    runs/<run>/policy/v<version>/...                             HF directory of a policy
    runs/<run>/policy/v<version>/manifest.json                   written last: version complete
    runs/<run>/policy/latest.json                                pointer, written after manifest
    runs/<run>/learner/step-<step>.json                          ack: trajectories consumed
    runs/<run>/run.json                                          TrainingRunInput of the run
"""


def run_prefix(run: str) -> str:
    return f"runs/{run}/"


def turn_prefix(run: str, task: str, sample: int, turn: int) -> str:
    return f"runs/{run}/tasks/{task}/s{sample}/turn-{turn}/"


def turn_key(run: str, task: str, sample: int, turn: int, name: str) -> str:
    return turn_prefix(run, task, sample, turn) + name


def trajectories_prefix(run: str) -> str:
    return f"runs/{run}/trajectories/"


def trajectory_key(run: str, task: str, sample: int) -> str:
    return f"{trajectories_prefix(run)}{task}--s{sample}.json"


def reward_key(run: str, grader: str, task: str, sample: int) -> str:
    return f"runs/{run}/rewards/{grader}/{task}--s{sample}.json"


def policy_prefix(run: str, version: int) -> str:
    return f"runs/{run}/policy/v{version:06d}/"


def policy_manifest_key(run: str, version: int) -> str:
    return policy_prefix(run, version) + "manifest.json"


def latest_policy_key(run: str) -> str:
    return f"runs/{run}/policy/latest.json"


def learner_ack_key(run: str, step: int) -> str:
    return f"runs/{run}/learner/step-{step:06d}.json"


def run_record_key(run: str) -> str:
    return f"runs/{run}/run.json"
