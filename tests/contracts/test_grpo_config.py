"""`GRPOConfig`'s cross-field rules: settings that would silently undo each other are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.learner import GRPOConfig


def test_redrawing_flat_groups_under_discounted_turn_credit_is_refused() -> None:
    """A group whose episodes scored alike in different numbers of turns has a signal under
    discounted turn credit (infra/credit.py), yet `has_signal` calls it flat: redrawing it
    dropped what that credit is for."""
    with pytest.raises(ValidationError, match="turn_discount < 1"):
        GRPOConfig(redraw_flat_groups=4, credit="turn", turn_discount=0.9)
    GRPOConfig(redraw_flat_groups=4, credit="turn", turn_discount=1.0)
    GRPOConfig(redraw_flat_groups=0, credit="turn", turn_discount=0.9)
    GRPOConfig(redraw_flat_groups=4, credit="episode", turn_discount=0.9)
