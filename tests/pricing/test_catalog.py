"""price_request against the example policies: matching, face values, factors, accounts."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from ledger.limits import MAX_ACCOUNTS, MAX_AMOUNT
from pricing import (
    MAX_HOLD_ACCOUNTS,
    MAX_MICROS,
    BadAmount,
    BadRiskFactor,
    EffectClass,
    PerEffectCapExceeded,
    RequestError,
    TenantPolicy,
    UnknownRoute,
    agent_for_token,
    agent_for_token_hash,
    check_per_effect_cap,
    factor_account,
    format_token,
    hash_token,
    hold_accounts,
    load_policy_data,
    load_policy_text,
    minor_to_major_text,
    policy_accounts,
    price_request,
    quantile_lgd,
    round_up,
)
from pricing.errors import BadQuery, PolicyError, UndeclaredField
from pricing.policy import UnknownRouteAction
from pricing.reading import check_effect_body
from pricing.templates import FACTOR_PREFIX

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
USD = 10**6


def load(name: str) -> TenantPolicy:
    return load_policy_text((EXAMPLES / name).read_text(), name)


ACME = load("procurement.yaml")
GLOBEX = load("globex.yaml")


def order(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "supplier_id": "bolt-co",
        "sku": "M8",
        "quantity": 3,
        "unit_price": Decimal("14.80"),
    }
    body.update(overrides)
    return body


def price_order(body: object, policy: TenantPolicy = ACME) -> int:
    return price_request(policy, "supplier", "POST", "/orders", {}, body).price_micros


def test_order_is_priced_from_quantity_times_unit_price() -> None:
    effect = price_request(ACME, "supplier", "post", "/orders", {}, order())
    assert effect.effect_class is EffectClass.COMPENSABLE
    assert effect.face_value_micros == 44_400_000
    assert effect.price_micros == round_up(44_400_000, quantile_lgd(6, 2, 0.0, 0.999))
    assert 0.76 * 44_400_000 < effect.price_micros < 0.77 * 44_400_000
    assert effect.risk_factors == ("supplier:bolt-co",)
    assert effect.route_id == "supplier POST /orders"
    assert effect.upstream == "http://127.0.0.1:8900"
    assert not effect.needs_approval


@pytest.mark.parametrize(
    "unit_price",
    [
        pytest.param(Decimal("14.80"), id="decimal"),
        pytest.param("14.80", id="numeric-string"),
        pytest.param("14.8", id="numeric-string-short"),
        pytest.param(14.8, id="float"),
    ],
)
def test_face_value_number_forms_agree(unit_price: object) -> None:
    assert price_order(order(unit_price=unit_price)) == price_order(order())


@pytest.mark.parametrize(
    ("overrides", "field", "problem"),
    [
        pytest.param({"quantity": True}, "quantity", "boolean", id="bool"),
        pytest.param({"quantity": -3}, "quantity", "negative", id="negative"),
        pytest.param({"quantity": Decimal("NaN")}, "quantity", "finite", id="nan"),
        pytest.param({"quantity": Decimal("Infinity")}, "quantity", "finite", id="inf"),
        pytest.param({"quantity": "three"}, "quantity", "plain", id="non-numeric"),
        pytest.param({"quantity": None}, "quantity", "NoneType", id="null"),
        pytest.param({"quantity": [3]}, "quantity", "list", id="list"),
        pytest.param({"unit_price": None, "quantity": 1}, "unit_price", "NoneType", id="null2"),
        pytest.param({"quantity": 10**12}, "quantity * unit_price", "maximum", id="too-large"),
    ],
)
def test_bad_face_values_name_the_field(
    overrides: dict[str, object], field: str, problem: str
) -> None:
    with pytest.raises(BadAmount, match=problem) as info:
        price_order(order(**overrides))
    assert info.value.field == field
    assert info.value.reason == "bad_amount"


def test_pricing_holds_the_ledgers_bounds() -> None:
    """ledger/limits.py's bounds, in pricing: a face value or a policy amount of
    MAX_AMOUNT minor units is priced or loaded; one more is refused."""
    assert (MAX_MICROS, MAX_HOLD_ACCOUNTS) == (MAX_AMOUNT, MAX_ACCOUNTS)
    at, over = (minor_to_major_text(n, USD) for n in (MAX_AMOUNT, MAX_AMOUNT + 1))
    effect = price_request(
        ACME, "supplier", "POST", "/orders", {}, order(quantity=1, unit_price=at)
    )
    assert effect.face_value_micros == MAX_AMOUNT
    with pytest.raises(BadAmount, match="maximum"):
        price_order(order(quantity=1, unit_price=over))
    document = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    document["accounts"]["tenant"]["limit"] = at
    assert policy_accounts(load_policy_data(document, "at.yaml"))[0].limit_micros == MAX_AMOUNT
    document["accounts"]["tenant"]["limit"] = over
    with pytest.raises(PolicyError, match=r"accounts\.tenant\.limit: .*maximum"):
        load_policy_data(document, "over.yaml")


def test_missing_face_field_and_non_object_body() -> None:
    body = order()
    del body["unit_price"]
    with pytest.raises(BadAmount, match="'unit_price': is missing"):
        price_order(body)
    with pytest.raises(BadAmount, match="missing"):
        price_order([1, 2])


def test_a_route_declaring_its_body_takes_no_other_field() -> None:
    """Unpriced fields were forwarded: a second amount, an `express: true` surcharge."""
    with pytest.raises(UndeclaredField, match="'express': is not a field of this route"):
        price_order(order(express=True))
    declared = frozenset({"item.sku", "item.qty", "note"})
    check_effect_body({"item": {"sku": "a", "qty": 1}, "note": {"any": ["thing"]}}, declared)
    with pytest.raises(UndeclaredField, match=r"'item\.price'"):
        check_effect_body({"item": {"sku": "a", "price": 0}}, declared)
    with pytest.raises(UndeclaredField, match="'item'"):
        check_effect_body({"item": "not an object"}, declared)
    check_effect_body({"anything": 1}, frozenset())  # declares none: not checked


@pytest.mark.parametrize(
    ("supplier", "factor"),
    [
        pytest.param("Acme-Steel", "supplier:acme-steel", id="case-folded"),
        pytest.param(42, "supplier:42", id="integer-id"),
        pytest.param(2**53 - 1, f"supplier:{2**53 - 1}", id="largest-exact-integer"),
        # An API that parses ids as integers reads '042' as customer 42: one account.
        pytest.param("042", "supplier:42", id="leading-zeros"),
        pytest.param("000", "supplier:0", id="zeros"),
        pytest.param("0x2a", "supplier:0x2a", id="not-all-digits"),
        # Each of these is customer 42 to an API that reads ids as numbers (JavaScript's
        # parseFloat, a PHP cast, a MySQL comparison): one account, not six that an agent
        # could fill one cap each of.
        pytest.param("42.0", "supplier:42", id="a-fraction-of-zero"),
        pytest.param("4.2e1", "supplier:42", id="an-exponent"),
        pytest.param("42.", "supplier:42", id="a-trailing-point"),
        pytest.param("42E0", "supplier:42", id="a-zero-exponent"),
        pytest.param("0042.00", "supplier:42", id="zeros-both-sides"),
        pytest.param("+42", "supplier:42", id="a-plus-sign"),
        pytest.param("4.25e1", "supplier:42.5", id="a-fraction"),
        pytest.param("042.50", "supplier:42.5", id="a-fraction-with-zeros"),
        pytest.param("-0.0", "supplier:0", id="negative-zero"),
        pytest.param("1.2.3", "supplier:1.2.3", id="a-version-not-a-number"),
        pytest.param("1" + "0" * 60, "supplier:1" + "0" * 60, id="a-long-digit-string"),
    ],
)
def test_risk_factor_expansion(supplier: object, factor: str) -> None:
    effect = price_request(ACME, "supplier", "POST", "/orders", {}, order(supplier_id=supplier))
    assert effect.risk_factors == (factor,)


@pytest.mark.parametrize(
    "supplier",
    [
        pytest.param("acme steel", id="space"),
        pytest.param("", id="empty"),
        pytest.param(True, id="bool"),
        pytest.param({"id": 1}, id="object"),
        pytest.param("x" * 200, id="too-long"),
        # A parser reading numbers as doubles sees 2^60 here: one supplier, two accounts.
        pytest.param(2**60 + 1, id="integer-past-2^53"),
        pytest.param(-(2**60), id="negative-past-2^53"),
        # A number spelled too large or too small for an id: its digits would not fit.
        pytest.param("1e999999", id="a-huge-exponent"),
        pytest.param("1e-999999", id="a-tiny-exponent"),
    ],
)
def test_bad_risk_factor_values(supplier: object) -> None:
    with pytest.raises(BadRiskFactor) as info:
        price_order(order(supplier_id=supplier))
    assert info.value.field == "supplier_id"


def test_a_format_extension_on_a_last_path_parameter_names_the_same_factor() -> None:
    """Rails' `.:format` and Spring's suffix matching route `DELETE /stock/77.json` to
    item 77: its factor account is item 77's, not one of its own per extension."""
    document = yaml.safe_load((EXAMPLES / "globex.yaml").read_text())
    document["routes"].append(
        {
            "tool": "inventory",
            "route": "DELETE /stock/{sku}",
            "class": "irreversible",
            "query": ["units"],
            "face_value": "units",
            "risk_factors": ["sku:{sku}"],
        }
    )
    policy = load_policy_data(document, "globex.yaml")
    for path in ("/stock/77", "/stock/77.json", "/stock/77.xml", "/stock/077.json"):
        effect = price_request(policy, "inventory", "DELETE", path, {"units": "5"}, None)
        assert effect.risk_factors == ("sku:77",), path
    # A parameter before the last segment is not read so: /stock/77.json/writeoff is
    # item 77.json to those routers too.
    body = {"units": 1, "unit_cost": 1}
    effect = price_request(policy, "inventory", "POST", "/stock/77.json/writeoff", {}, body)
    assert effect.risk_factors == ("sku:77.json",)


def test_query_fields_and_duplicates() -> None:
    body = {"units": 4, "unit_cost": "2.50"}
    effect = price_request(GLOBEX, "inventory", "POST", "/transfers", {"sku": "A-1"}, body)
    assert effect.face_value_micros == 1000  # euro cents
    assert effect.risk_factors == ("sku:a-1",)
    with pytest.raises(BadQuery, match="2 times"):
        price_request(GLOBEX, "inventory", "POST", "/transfers", {"sku": ["a", "b"]}, body)
    effect = price_request(GLOBEX, "inventory", "POST", "/transfers", {"sku": ["a"]}, body)
    assert effect.risk_factors == ("sku:a",)


def test_path_parameters_feed_factors_and_lookup() -> None:
    body = {"units": 2, "unit_cost": 3}
    effect = price_request(GLOBEX, "inventory", "POST", "/stock/W-9/writeoff", {}, body)
    assert effect.effect_class is EffectClass.IRREVERSIBLE
    assert effect.price_micros == effect.face_value_micros == 600
    assert effect.risk_factors == ("sku:w-9",)
    cancel = price_request(
        ACME,
        "supplier",
        "POST",
        "/orders/o 1/cancel",
        {},
        {"supplier_id": "s", "cancellation_fee": 5},
    )
    assert cancel.lookup_request("k/1 2") == (
        "GET",
        "/orders/o%201/cancellations?idempotency_key=k%2F1%202",
    )


def test_literal_segment_beats_parameter() -> None:
    effect = price_request(ACME, "supplier", "GET", "/catalog", {}, None)
    assert effect.route is not None and effect.route.template.text == "/catalog"
    param = price_request(ACME, "supplier", "GET", "/orders/catalog", {}, None)
    assert param.route is not None and param.path_params == {"order_id": "catalog"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/orders/../refunds", id="dot-dot"),
        pytest.param("/orders/./x", id="dot"),
        pytest.param("//orders", id="empty-segment"),
        pytest.param("/orders/", id="trailing-slash-an-upstream-may-strip"),
        pytest.param("/orders%2F..%2Frefunds", id="encoded-slash"),
        pytest.param("/orders/%2e%2e", id="encoded-dots"),
    ],
)
def test_non_canonical_paths_are_refused(path: str) -> None:
    with pytest.raises(RequestError, match="canonical"):
        price_request(ACME, "supplier", "GET", path, {}, None)


def test_unknown_routes_fail_closed_or_price_at_face() -> None:
    assert ACME.document.unknown_routes.action is UnknownRouteAction.DENY
    with pytest.raises(UnknownRoute, match="not in the tenant's route catalog"):
        price_request(ACME, "supplier", "DELETE", "/orders/1", {}, None)
    with pytest.raises(UnknownRoute, match="tool 'inventory'"):
        price_request(ACME, "inventory", "GET", "/stock/x", {}, None)
    effect = price_request(GLOBEX, "inventory", "POST", "/adjust", {}, {"amount": "12.34"})
    assert effect.route is None and effect.effect_class is EffectClass.IRREVERSIBLE
    assert effect.price_micros == effect.face_value_micros == 1234
    assert effect.needs_approval is False
    big = price_request(GLOBEX, "inventory", "POST", "/adjust", {}, {"amount": "600"})
    assert big.needs_approval
    with pytest.raises(BadAmount, match="'amount'"):
        price_request(GLOBEX, "inventory", "POST", "/adjust", {}, {})


def test_route_id_is_the_template_or_an_unknown_routes_own_path() -> None:
    """The one route id the gateway keys holds, learned prices and settlers by."""
    listed = price_request(
        GLOBEX, "inventory", "POST", "/stock/bolts/writeoff", {}, {"units": 1, "unit_cost": "2"}
    )
    assert listed.route_id == "inventory POST /stock/{sku}/writeoff"
    adjust = price_request(GLOBEX, "inventory", "POST", "/adjust", {}, {"amount": "1"})
    recount = price_request(GLOBEX, "inventory", "POST", "/recount/7", {}, {"amount": "1"})
    assert (adjust.route_id, recount.route_id) == (
        "inventory POST /adjust",
        "inventory POST /recount/7",
    )


def test_approval_threshold_compares_the_price() -> None:
    # 40,000 USD face prices at ~30,500 USD: above the route's 30,000 USD threshold.
    assert price_request(
        ACME, "supplier", "POST", "/orders", {}, order(quantity=1, unit_price=40_000)
    ).needs_approval
    assert not price_request(
        ACME, "supplier", "POST", "/orders", {}, order(quantity=1, unit_price=39_000)
    ).needs_approval


def test_fixed_face_value_for_in_process_route() -> None:
    effect = price_request(ACME, "deploy", "POST", "/deploys", {}, None)
    assert effect.in_process and effect.upstream is None
    assert effect.price_micros == 1000 * USD


@pytest.mark.parametrize(
    ("supplier", "refused"),
    [
        ("42", False),
        ("0042", False),
        ("4.2e1", False),  # one spelling of 42 already
        ("-7", False),
        ("42abc", True),  # parseInt, a PHP cast, MySQL: 42
        ("4_2", True),  # Python's int(), Ruby's to_i: 42
        ("42-x", True),
        ("42.5", True),
        ("acme-steel", False),  # the exact entry's own account: no id to read
    ],
)
def test_a_factor_of_integer_ids_refuses_other_ids(supplier: str, refused: bool) -> None:
    """`ids: integer` on a pattern: its ids are numbers to the tool API, so an id
    with more after its digits is refused rather than given a cap of its own."""
    document = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    document["accounts"]["risk_factors"]["supplier:*"]["ids"] = "integer"
    policy = load_policy_data(document, "procurement.yaml")
    buyer = next(iter(policy.agents_by_hash.values()))
    effect = price_request(policy, "supplier", "POST", "/orders", {}, order(supplier_id=supplier))
    if refused:
        with pytest.raises(BadRiskFactor, match="integer"):
            hold_accounts(policy, buyer, effect)
    else:
        assert FACTOR_PREFIX + effect.risk_factors[0] in hold_accounts(policy, buyer, effect)


def test_hold_accounts_in_order() -> None:
    token = format_token(bytes(range(32)))
    agent = agent_for_token_hash(ACME, hash_token(token))
    assert agent is None  # not an acme token
    buyer = next(iter(ACME.agents_by_hash.values()))
    effect = price_request(ACME, "supplier", "POST", "/orders", {}, order(supplier_id="ACME-steel"))
    accounts = hold_accounts(ACME, buyer, effect)
    assert list(accounts) == [
        "tenant:acme",
        f"principal:{buyer.principal_id}",
        f"agent:{buyer.agent_id}",
        "factor:supplier:acme-steel",
    ]
    assert set(accounts.values()) == {effect.price_micros}
    with pytest.raises(ValueError, match="tenant"):
        hold_accounts(GLOBEX, buyer, effect)


def test_factor_accounts_take_the_most_specific_pattern() -> None:
    watched = factor_account(ACME, "supplier:acme-steel")
    other = factor_account(ACME, "supplier:bolt-co")
    assert watched is not None and other is not None
    assert (watched.account_id, watched.limit_micros) == (
        "factor:supplier:acme-steel",
        60_000 * USD,
    )
    assert (other.account_id, other.limit_micros) == ("factor:supplier:bolt-co", 100_000 * USD)
    assert factor_account(ACME, "region:eu") is None


def test_policy_accounts_list_every_defined_account() -> None:
    specs = {s.account_id: s for s in policy_accounts(ACME)}
    assert specs["tenant:acme"].limit_micros == 250_000 * USD
    assert specs["tenant:acme"].window_ms == 86_400_000
    assert specs["tenant:acme"].soft_limit_micros == 200_000 * USD
    assert specs["principal:finance"].soft_band == 0.9
    assert specs["agent:buyer-07"].limit_micros == 100_000 * USD
    assert "factor:supplier:acme-steel" in specs
    assert not any("*" in a for a in specs)
    assert len([a for a in specs if a.startswith("agent:")]) == len(ACME.document.agents)


def test_tokens_authenticate_by_hash_only() -> None:
    token = format_token(b"\x01" * 32)
    assert token.startswith("irrev_") and len(token) == 49
    assert hash_token(token).startswith("sha256:") and len(hash_token(token)) == 71
    assert agent_for_token(GLOBEX, token) is None
    with pytest.raises(ValueError, match="32 random bytes"):
        format_token(b"short")


def test_per_effect_cap_applies_to_face_value() -> None:
    buyer = next(iter(ACME.agents_by_hash.values()))
    small = price_request(ACME, "supplier", "POST", "/orders", {}, order())
    check_per_effect_cap(buyer, small)
    big = price_request(
        ACME, "supplier", "POST", "/orders", {}, order(quantity=1, unit_price=50_001)
    )
    with pytest.raises(PerEffectCapExceeded, match="per-effect cap") as info:
        check_per_effect_cap(buyer, big)
    assert info.value.reason == "per_effect_cap"
    check_per_effect_cap(buyer, price_request(ACME, "supplier", "GET", "/catalog", {}, None))
