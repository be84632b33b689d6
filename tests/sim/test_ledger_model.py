from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim import ledger_model as lm


def _decide(balance: list[int], amount: int, limit: list[int], soft: list[int]) -> int:
    b = np.array([balance], np.int64)
    acc = np.arange(len(balance))[None, :]
    code = lm.decide(b, np.array([limit]), np.array([soft]), acc, np.array([amount]))
    return int(code[0])


def test_admits_within_soft_band() -> None:
    assert _decide([10, 0], 5, [100, 50], [90, 45]) == lm.ADMIT


def test_escalates_when_any_account_enters_its_soft_band() -> None:
    assert _decide([10, 42], 5, [100, 50], [90, 45]) == lm.ESCALATE


def test_denies_when_any_account_would_pass_its_limit() -> None:
    assert _decide([10, 46], 5, [100, 50], [90, 45]) == lm.DENY


def test_exactly_at_the_limit_is_allowed() -> None:
    assert _decide([95], 5, [100], [100]) == lm.ADMIT


def test_overrun_account_admits_nothing() -> None:
    assert _decide([101], 0, [100], [100]) == lm.DENY


def test_apply_touches_every_account_or_none() -> None:
    balance = np.zeros((2, 4), np.int64)
    lm.apply(balance, np.array([[0, 2], [1, 3]]), np.array([7, 0]))
    assert balance.tolist() == [[7, 0, 7, 0], [0, 0, 0, 0]]


def test_soft_band_rounds_down_and_keeps_unlimited() -> None:
    band = lm.soft_band(np.array([1001, lm.UNLIMITED], np.int64), 0.9)
    assert band.tolist() == [900, lm.UNLIMITED]


@given(
    st.lists(st.integers(0, 10**9), min_size=1, max_size=200),
    st.integers(1, 10**10),
    st.floats(0.1, 1.0),
)
def test_sequential_reserves_never_exceed_any_limit(
    amounts: list[int], limit: int, frac: float
) -> None:
    limits = np.array([[limit, limit // 2 + 1]], np.int64)
    soft = lm.soft_band(limits[0], frac)[None, :]
    balance = np.zeros((1, 2), np.int64)
    acc = np.array([[0, 1]])
    for amount in amounts:
        code = lm.decide(balance, limits, soft, acc, np.array([amount], np.int64))
        if code[0] == lm.ADMIT:
            lm.apply(balance, acc, np.array([amount], np.int64))
        assert (balance <= soft).all()
