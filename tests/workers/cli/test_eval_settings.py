"""`tempered eval` reproduces a run's held-out evaluation and never mixes two evaluations up.

`--run R --policy N` used its own settings (256 new tokens, a 4096-token context, one turn) and
the first `--limit` tasks, not the run's `eval_sampling`, `max_context_tokens`, `eval_turns` and
`heldout_limit` (`spread`); two evals of different models started in the same second shared the
run `eval-<local time>`, the second one measuring the first one's weights; and a rerun with other
sampling settings shared the first one's eval run id, so the inference activity handed back the
completions stored then. Real Temporal dev server, real SeaweedFS, real sandbox and trajectory
writer in this process; only the model is scripted (it records what it was asked).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.run import spread
from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra import keys
from infra.policy import file_digests, policy_digest, policy_manifest, publish_policy
from infra.settings import Settings
from infra.storage import ObjectStore, sha256_file
from infra.tasks import load_suite
from tests.fixtures.cli_settings import cli_settings
from tests.workers.cli.eval_setup import (
    RUN,
    Capture,
    evaluate_with,
    quarantine,
    recorded_run,
    task_ids,
)
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from workers.cli import run


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_eval_of_a_runs_version_uses_the_runs_evaluation_settings(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    spec = recorded_run(store)
    heldout = load_suite("starter", split="heldout")

    code, calls, out, err = await evaluate_with(
        settings, store, ["--run", RUN, "--policy", "0"], capsys
    )
    assert code == 0, err
    assert task_ids(calls) == {t.id for t in spread(heldout, spec.heldout_limit)}
    assert calls and all(call.sampling == spec.eval_sampling for call in calls)
    assert {call.max_context_tokens for call in calls} == {2048}
    assert {call.turn for call in calls} == {0, 1}  # eval_turns 2: the wrong answers retried
    summary = json.loads(out)
    assert (summary["tasks"], summary["turns"], summary["pass_at_1"]) == (4, 2, 0.0)
    results = [
        k for k in store.list_keys(f"runs/{summary['eval_run']}/") if k.endswith("result.json")
    ]
    assert results and spec.limits != SandboxLimits()  # the programs ran under the run's limits
    assert all(store.get_model(k, ExecutionResult).limits == spec.limits for k in results)
    assert "settings of run 'rec' (its run.json)" in err
    assert "max_new_tokens 128, max_context_tokens 2048, turns 2" in err

    # given on the command line, a setting is the user's; `--limit` spreads as heldout_limit does
    argv = ["--run", RUN, "--policy", "0", "--max-new-tokens", "64", "--max-turns", "1"]
    code, calls, out, err = await evaluate_with(settings, store, [*argv, "--limit", "3"], capsys)
    assert code == 0, err
    assert task_ids(calls) == {t.id for t in spread(heldout, 3)}
    assert len({t.rsplit("-", 1)[0] for t in task_ids(calls)}) == 3  # three families, not one
    given = spec.eval_sampling.model_copy(update={"max_new_tokens": 64})
    assert calls and all(call.sampling == given for call in calls)
    assert {(call.max_context_tokens, call.turn) for call in calls} == {(2048, 0)}
    assert "--max-new-tokens, --max-turns, --limit from the command line" in err


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_no_two_evals_share_an_eval_run_and_its_id_names_the_settings(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    """The stored completions of 128-token turns were handed back to a 32-token rerun (the
    same id, the same prompts). The same settings again get an id of their own too (a shared
    one failed their trajectories' writes); the settings' digest is the same there."""
    recorded_run(store)
    argv = ["--run", RUN, "--policy", "0", "--limit", "1", "--max-turns", "1"]
    runs = []
    for extra in ([], ["--max-new-tokens", "32"], [], ["--max-context-tokens", "1024"]):
        code, calls, out, err = await evaluate_with(settings, store, [*argv, *extra], capsys)
        assert code == 0, err
        (eval_run,) = {call.run_id for call in calls}
        assert json.loads(out)["eval_run"] == eval_run
        assert eval_run.startswith(f"{RUN}-eval-v0--starter-")
        runs.append(eval_run)
    assert len(set(runs)) == 4
    digests = [name.split("-")[-2] for name in runs]
    assert digests[0] == digests[2] and len({digests[0], digests[1], digests[3]}) == 3


def model_dir(root: Path, tag: str) -> Path:
    out = root / tag
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": tag}))
    (out / "model.safetensors").write_bytes(tag.encode() * 1000)
    return out


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_evals_measure_their_own_models_and_publish_each_once(
    settings: Settings, store: ObjectStore, tmp_path: Path, capsys: Capture
) -> None:
    """A model is published as v0 of the run its content names: two evals of other weights
    never share a run (two in one second once shared `eval-<second>`, and the second printed
    model A's pass@1 as model B's), and an eval of the same weights again publishes nothing
    (each eval left a copy of the model in a run of its own)."""
    published: dict[str, str] = {}
    stored: dict[str, list[str]] = {}
    for tag in ("A", "B", "A"):
        local = tmp_path / tag if (tmp_path / tag).exists() else model_dir(tmp_path, tag)
        argv = ["--policy", str(local), "--limit", "1"]
        code, calls, out, err = await evaluate_with(settings, store, argv, capsys)
        assert code == 0, err
        summary = json.loads(out)
        assert {call.policy_run for call in calls} == {summary["policy_run"]}
        manifest = policy_manifest(store, summary["policy_run"], 0)
        assert manifest is not None
        weights = manifest.files["model.safetensors"].sha256
        assert weights == sha256_file(local / "model.safetensors"), tag
        if tag in published:
            assert summary["policy_run"] == published[tag]
            assert stored[tag] == sorted(store.list_keys(keys.run_prefix(published[tag])))
        published[tag] = summary["policy_run"]
        stored[tag] = sorted(store.list_keys(keys.run_prefix(published[tag])))
    assert published["A"] != published["B"]
    assert published["A"] == f"eval-base-{policy_digest(file_digests(tmp_path / 'A'))}"


def test_an_eval_whose_version_0_holds_other_weights_stops_naming_them(
    store: ObjectStore, tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should two evals still meet in one run id, the second does not measure the first's
    model: publishing is first-writer-wins, so it checks what version 0 holds. Temporal is not
    reached (the check comes before any task)."""
    settings = cli_settings(tmp_path / "home", store)
    taken = f"eval-base-{policy_digest(file_digests(model_dir(tmp_path, 'B')))}"
    publish_policy(store, taken, 0, model_dir(tmp_path, "A"))
    argv = ["eval", "--policy", str(tmp_path / "B"), "--wait-for-workers"]
    assert run(argv, settings) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tempered eval: run '{taken}' already has a version 0 of other ")
    assert err.count("\n") == 1


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_eval_leaves_out_the_quarantined_tasks_as_the_run_does(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    """A held-out task `tempered tasks validate` quarantined is not in the run's evaluations
    (`load_tasks` leaves it out before `spread`); `tempered eval --run` spread over it too."""
    spec = recorded_run(store)
    heldout = load_suite("starter", split="heldout")
    bad = spread(heldout, spec.heldout_limit)[0]
    quarantine(settings, bad)
    argv = ["--run", RUN, "--policy", "0", "--max-turns", "1"]
    code, calls, _, err = await evaluate_with(settings, store, argv, capsys)
    assert code == 0, err
    kept = [task for task in heldout if task.id != bad.id]
    assert task_ids(calls) == {t.id for t in spread(kept, spec.heldout_limit)}
