"""The state of an app of several roles (ft.ddp) from its roles' states."""

from __future__ import annotations

from typing import List

import pytest
from torchx.specs import AppState

from torchx_elastic.schedulers.role_states import several_roles_state

S, F, R, P = AppState.SUCCEEDED, AppState.FAILED, AppState.RUNNING, AppState.PENDING


@pytest.mark.parametrize(
    "states,expected",
    [
        ([R, R, R], (R, "")),
        ([P, P, P], (P, "")),
        ([R, F, R], (R, "")),  # one group failed for good: the other trains on
        ([F, R, R], (F, "the lighthouse role failed")),
        ([R, F, F], (F, "every other role failed (group0, group1)")),
        ([S, S, S], (S, "")),
        ([S, S, F], (F, "group1 failed")),
    ],
)
def test_the_app_state_from_its_roles(
    states: List[AppState], expected: tuple[AppState, str]
) -> None:
    assert (
        several_roles_state(list(zip(["lighthouse", "group0", "group1"], states, strict=True)))
        == expected
    )
