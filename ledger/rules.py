"""A Ledger's bounded-time rules: set, deleted (both journaled) and read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import validate
from .errors import raise_for_reply, translate_redis_errors
from .keys import rules_key, tenant_keys
from .records import Rule, Status
from .replies import decoded

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object


class Rules(LedgerCore):
    """Rules of each tenant (a mixin of Ledger)."""

    async def set_rule(
        self,
        tenant: str,
        rule_id: str,
        admin: str,
        spec: str,
        ttl_ms: int,
        raise_limit: tuple[str, int] | None = None,
    ) -> int:
        """Set a bounded-time rule, live for `ttl_ms` from now (Redis's clock); returns
        its expiry. Journaled. `raise_limit` (account, amount): while the rule lives,
        the account's limit and soft limit are that much higher in every reserve;
        UnknownAccount if the account does not exist."""
        tenant = validate.tenant_id(tenant)
        keys = [*tenant_keys(tenant)[:2], rules_key(tenant)]
        args = [
            "set",
            validate.identifier("rule", rule_id),
            validate.identifier("admin", admin),
            spec,
            str(validate.ttl("ttl_ms", ttl_ms)),
        ]
        if raise_limit is not None:
            account, amount = raise_limit
            args += [validate.account_id(account), str(validate.amount("amount", amount))]
        reply = await self._run("rule", keys, args)
        raise_for_reply(tenant, "", "rule", reply)
        return int(reply[1])

    async def delete_rule(self, tenant: str, rule_id: str, admin: str) -> bool:
        """Delete a live rule (journaled); False if there is none by that id."""
        tenant = validate.tenant_id(tenant)
        keys = [*tenant_keys(tenant)[:2], rules_key(tenant)]
        args = ["delete", validate.identifier("rule", rule_id), validate.identifier("admin", admin)]
        reply = await self._run("rule", keys, args)
        if reply[0] == Status.NOT_FOUND:
            return False
        raise_for_reply(tenant, "", "rule", reply)
        return True

    async def rules(self, tenant: str, now_ms: int) -> list[Rule]:
        """The tenant's rules live at `now_ms` (Redis's clock), by id."""
        with translate_redis_errors("rules"):
            stored = await decoded(self.redis.hgetall(rules_key(validate.tenant_id(tenant))))
        out = []
        for name, spec in stored.items():
            until = stored.get(f"{name}|until")
            if "|" not in name and until is not None and int(until) > now_ms:
                out.append(Rule(name, spec, int(until)))
        return sorted(out, key=lambda rule: rule.rule_id)
