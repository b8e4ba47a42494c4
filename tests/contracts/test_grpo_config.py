"""`GRPOConfig`'s cross-field rules for a new run (`new_run_problem`, asked by `load_preset`):
settings that would silently undo each other are refused, while a stored input that has them
(a run of an earlier release) still decodes."""

from __future__ import annotations

import pytest

from contracts.learner import GRPOConfig
from infra.presets import load_preset


def test_redrawing_flat_groups_under_discounted_turn_credit_is_refused_for_a_new_run() -> None:
    """A group whose episodes scored alike in different numbers of turns has a signal under
    discounted turn credit (infra/credit.py), yet `has_signal` calls it flat: redrawing it
    dropped what that credit is for."""
    both = {"redraw_flat_groups": 4, "credit": "turn", "turn_discount": 0.9}
    assert "turn_discount < 1" in (GRPOConfig(**both).new_run_problem() or "")
    with pytest.raises(ValueError, match="redraw_flat_groups with credit = 'turn'"):
        load_preset("tiny", grpo=both)
    stored = GRPOConfig(**both).model_dump_json()  # as an earlier release stored it
    assert GRPOConfig.model_validate_json(stored).redraw_flat_groups == 4
    for fine in (
        {"redraw_flat_groups": 4, "credit": "turn", "turn_discount": 1.0},
        {"redraw_flat_groups": 0, "credit": "turn", "turn_discount": 0.9},
        {"redraw_flat_groups": 4, "credit": "episode", "turn_discount": 0.9},
    ):
        assert GRPOConfig(**fine).new_run_problem() is None
