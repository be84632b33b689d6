"""The fleet's release flag: the newest record format every gateway of the fleet
reads (`irrev:{fleet}:release`), so that two releases can serve one Redis at once
during a rolling upgrade (docs/operations.md, "Rolling upgrades").

Each release loads its own scripts, so old and new scripts run side by side on the
same keys. A release reads every format the releases before it wrote; while the flag
says an older release may still be serving, it writes nothing those cannot read.
Format 1 is what the releases before the flag read and write. Format 2 adds what
their scripts would corrupt:

- an agent's count of escalations waiting (`<account>|esc`, reserve.lua's
  max_escalations cap) and the hold's mark that it is counted (`esc`): an older
  release's scripts resolve such a hold without uncounting it, and the agent's
  escalations are refused for good once the stale count reaches the cap;
- idle risk-factor accounts closed (close.lua): an older release's post, true-up or
  compensation of a hold on a closed account fails in Redis (a Lua error: a 500).

Format 3 adds settled holds archived out of the tenant's slot (ledger/archive.py): an
older release's reserve does not look in the settled index, and would admit an
archived hold's id again.

Everything else this release writes that an older one does not know is additive
(fields and keys the older scripts and code never read), and it reads what older
releases write. The flag only goes up: `finish` (run once the last old gateway has
stopped) raises it; a store without one is decided once, by the first process of
this release that needs it."""

from __future__ import annotations

from .cluster import RedisClient
from .errors import LedgerError, translate_redis_errors
from .keys import RELEASE_KEY, TENANTS_KEY

# The releases before the flag.
PREVIOUS_FORMAT = 1
# What each format adds (above): escalations counted and idle accounts closed (2),
# settled holds archived (3).
COUNTED_ESCALATIONS = 2
ARCHIVED_HOLDS = 3
# What this release writes once every host reads it.
FORMAT = ARCHIVED_HOLDS


class BadReleaseFlag(LedgerError):
    def __init__(self, text: str) -> None:
        super().__init__(
            f"{RELEASE_KEY} holds {text!r}, not a format number; set it with "
            "`irrev ledger upgrade finish` once every gateway runs this release"
        )


class FleetRelease:
    """The flag as this process last read it (`format`), and its one writer."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        # Until read, this release's own: a process that never reads the flag (a
        # test's ledger, a bench) works on a store of its own.
        self.format = FORMAT
        self._read = False

    @property
    def upgraded(self) -> bool:
        """Whether every host of the fleet reads this release's records."""
        return self.format >= FORMAT

    def reads(self, format_: int) -> bool:
        """Whether every host of the fleet reads records of `format_`."""
        return self.format >= format_

    async def read(self) -> int:
        """The flag, decided first if the store has none: format 1 when tenants are
        registered (a release before the flag served this store, and its gateways may
        still run), else this release's (a new store). Racing deciders agree: the
        first SET wins and each reads it back."""
        with translate_redis_errors("reading the fleet's release"):
            text = await self.redis.get(RELEASE_KEY)
            if text is None:
                older = await self.redis.exists(TENANTS_KEY)
                decided = PREVIOUS_FORMAT if older else FORMAT
                await self.redis.set(RELEASE_KEY, str(decided), nx=True)
                text = await self.redis.get(RELEASE_KEY)
        self.format = _format(text)
        self._read = True
        return self.format

    async def register(self, *tenants: str) -> None:
        """Add `tenants` to the list operators' commands (audit, sweep) walk, the flag
        decided first: once a tenant is registered, a store without a flag reads as
        served by an older release."""
        if not self._read:
            await self.read()
        with translate_redis_errors("registering a tenant"):
            await self.redis.sadd(TENANTS_KEY, *tenants)

    async def finish(self) -> int:
        """Every host runs this release (or a later one): write its format from now
        on. Returns the format the flag had (never lowers it)."""
        before = await self.read()
        if before < FORMAT:
            with translate_redis_errors("finishing the upgrade"):
                await self.redis.set(RELEASE_KEY, str(FORMAT))
            self.format = FORMAT
        return before


def _format(text: object) -> int:
    try:
        return int(str(text))
    except ValueError:
        raise BadReleaseFlag(str(text)) from None
