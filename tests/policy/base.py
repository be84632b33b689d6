"""A small valid policy to mutate into malformed ones."""

from __future__ import annotations

import copy
from typing import Any

import yaml

HASH_A = "sha256:" + "a" * 64
HASH_B = "sha256:" + "b" * 64

BASE: dict[str, Any] = {
    "tenant": "t1",
    "risk_unit": {"currency": "USD", "scale": 1_000_000},
    "window": "24h",
    "escalation_ttl": "15m",
    "hold_ttl": "5m",
    "accounts": {
        "tenant": {"limit": "1000"},
        "principals": {"ops": {"limit": "500"}},
        "risk_factors": {"supplier:*": {"limit": "300"}},
    },
    "agents": {
        "a1": {
            "principal": "ops",
            "token_sha256": HASH_A,
            "per_effect_cap": "100",
            "window_cap": "200",
        },
        "a2": {
            "principal": "ops",
            "token_sha256": HASH_B,
            "per_effect_cap": 50.5,
            "window_cap": 200,
        },
    },
    "tools": {"shop": {"upstream": "http://127.0.0.1:9000"}},
    "routes": [
        {"tool": "shop", "route": "GET /orders/{id}", "class": "read"},
        {
            "tool": "shop",
            "route": "POST /orders",
            "class": "compensable",
            "body": ["supplier_id", "quantity", "unit_price"],
            "face_value": "quantity * unit_price",
            "risk_factors": ["supplier:{supplier_id}"],
            "pricing": {"model": "quantile", "recovery": {"alpha": 6, "beta": 2}},
            "lookup": "GET /orders?idempotency_key={key}",
        },
        {
            "tool": "shop",
            "route": "POST /orders/{id}/refund",
            "class": "irreversible",
            "body": ["amount"],
            "face_value": "amount",
        },
    ],
}


def base() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def base_yaml() -> str:
    return yaml.safe_dump(BASE, sort_keys=False)
