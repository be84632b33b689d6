"""Irrev's ledger semantics as pure functions over integer arrays (micro-USD).

This is the decision the Redis scripts in ledger/ make, written so a test can replay
one operation sequence through both and compare: a reserve is all or nothing over the
accounts it touches; it is admitted iff every account stays within its hard limit
(pending + posted + amount <= limit) and escalated, not admitted, if any account would
pass its soft band. An account already above its limit (an overrun) admits nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

ADMIT, ESCALATE, DENY = 0, 1, 2
UNLIMITED = 2**62  # far from int64 overflow even with a large amount added


def decide(balance: I64, limit: I64, soft: I64, accounts: I64, amount: I64) -> I8:
    """Decision code per reserve.

    balance, limit, soft: (S, A) pending + posted, hard limit, soft band per account;
    accounts: (S, T) indices of the T accounts each reserve touches; amount: (S,).
    Returns (S,) int8 of ADMIT / ESCALATE / DENY.
    """
    after = np.take_along_axis(balance, accounts, 1) + amount[:, None]
    fits = (after <= np.take_along_axis(limit, accounts, 1)).all(axis=1)
    calm = (after <= np.take_along_axis(soft, accounts, 1)).all(axis=1)
    return np.where(fits, np.where(calm, ADMIT, ESCALATE), DENY).astype(np.int8)


def soft_band(limit: I64, frac: float) -> I64:
    """Soft band as a fraction of each limit, rounded down; unlimited stays unlimited."""
    band = np.floor(limit.astype(np.float64) * frac).astype(np.int64)
    return np.where(limit >= UNLIMITED, UNLIMITED, band)


def apply(balance: I64, accounts: I64, delta: I64) -> None:
    """Add delta (S,) to every touched account of each seed, in place.

    Within one seed the touched accounts are distinct, so plain fancy indexing is exact.
    """
    rows = np.arange(balance.shape[0])[:, None]
    balance[rows, accounts] += delta[:, None]
