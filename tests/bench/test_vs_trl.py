"""bench/vs_trl.py's rules: when a side has reached its target, what each side's clock counts,
which held-out tasks TRL evaluates, and which side goes first."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"target": None, "gain": 0.1, **given})


def test_plus_ten_points_is_counted_in_whole_tasks() -> None:
    """9/80 -> 17/80 is +8 tasks, +10 points; as floats 0.2125 < 0.1125 + 0.1."""
    from vs_trl import reached

    assert reached(17 / 80, 9 / 80, 80, args())
    assert not reached(16 / 80, 9 / 80, 80, args())
    assert reached(6 / 20, 4 / 20, 20, args())  # +2 of 20 tasks
    # +10 points of 25 is +2.5 tasks, of 45 +4.5: a whole task more (round() gave +2, +4)
    assert not reached(7 / 25, 5 / 25, 25, args()) and reached(8 / 25, 5 / 25, 25, args())
    assert not reached(9 / 45, 5 / 45, 45, args()) and reached(10 / 45, 5 / 45, 45, args())
    assert not reached(0.5, 0.5, 80, args(target=0.0))  # target 0: nothing to reach


def test_a_sides_clock_starts_after_its_setup() -> None:
    from vs_trl import Timeline

    timeline = Timeline("trl", args())
    time.sleep(0.2)  # imports, the model's load, the trainer's construction
    timeline.start()
    timeline.stepped(1)
    report = timeline.report()
    assert report["setup_s"] >= 0.2
    assert report["step_t_s"][0] < 0.2 and report["wall_s"] < 0.2


def test_trl_evaluates_the_held_out_tasks_tempered_evaluates(tmp_path: Path) -> None:
    from trl_side import heldout_tasks

    from contracts.run import spread
    from infra.presets import load_preset
    from infra.settings import Settings
    from infra.tasks import load_suite

    run = load_preset("tiny")
    assert run.heldout_limit == 20
    expected = spread(load_suite(run.suite, split="heldout"), run.heldout_limit)
    assert [t.id for t in heldout_tasks(run, Settings(home=tmp_path))] == [t.id for t in expected]


def test_the_side_that_goes_first_alternates_with_the_seed() -> None:
    from vs_trl import side_order

    assert side_order(0, None) == ["tempered", "trl"]
    assert side_order(1, None) == ["trl", "tempered"]
    assert side_order(1, "tempered") == ["tempered", "trl"]


def test_a_sides_clock_stops_when_its_run_ends_not_after_its_teardown() -> None:
    """Tempered's wall time per step counted its workers' shutdown and the stack's teardown
    (`tempered down`), TRL's nothing after `trainer.train()`: each side's clock stops when its
    run's result arrives, and the report is taken later."""
    from vs_trl import Timeline

    timeline = Timeline("tempered", args())
    timeline.start()
    timeline.stepped(1)
    timeline.finish()  # the run's result arrived
    time.sleep(0.3)  # workers stopping, the stack going down
    timeline.finish()  # a second end (TRL's, after train()) does not move it
    report = timeline.report()
    assert report["wall_s"] < 0.3 and report["s_per_step"] < 0.3, report


def test_the_benchs_evaluations_keep_the_presets_priority() -> None:
    """Both sides' eval sampling is the preset's (make train's evaluations go first:
    priority 1), greedy, to the bench's token budget."""
    from vs_trl import experiment

    from infra.presets import load_preset

    given = {"steps": 2, "seed": 0, "lr": None, "prompts_per_step": None, "group_size": None}
    run = experiment(
        args(
            preset="smollm2",
            max_new_tokens=64,
            train_last_layers=None,
            max_turns=1,
            eval_every=1,
            **given,
        )
    )
    assert run.eval_sampling.priority == load_preset("smollm2").eval_sampling.priority == 1
    assert run.eval_sampling.temperature == 0.0 and run.eval_sampling.max_new_tokens == 64


def test_trls_flat_groups_are_tempereds() -> None:
    """The groups whose tokens TRL's loss leaves out (`grpo_trainer`) are those Tempered's
    learner leaves out: no signal, round-off apart (`contracts.learner.has_signal`); the loss
    scale itself is tested against TRL (tests/bench/test_vs_trl_fix61.py, needs the extra)."""
    from trl_side import signal_rows

    rewards = [1.0, -0.1, 1.0, 1.0, -0.1, -0.1, 0.5, 0.5 + 1e-12]
    assert signal_rows(rewards, 2) == [True, True] + [False] * 6
    assert (
        signal_rows([0.5, 0.5, 0.5 + 1e-12, 0.5, 1.0, 0.5, 0.5, 0.5], 4) == [False] * 4 + [True] * 4
    )
