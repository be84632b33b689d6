"""A gateway trims its tenants' journals on a timer: old entries go to the archive
(JSON lines) once each, even with every worker running the trimmer, and the ledger
audit still checks every balance from the checkpoint."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger.checkpoint import archive_path, load_checkpoint
from ledger.client import Ledger
from ledger.cluster import redis_client
from ledger.keys import journal_key

from .conftest import Gateway, own_gateway
from .helpers import ledger_audit
from .servers import Server, Tenant

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

KEEP_S = 1


@pytest.fixture
def trimming_gateway(redis_url: str, suppliers: Server, tmp_path: Path) -> Iterator[Gateway]:
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path,
        2,
        IRREV_JOURNAL_KEEP_S=str(KEEP_S),
        IRREV_JOURNAL_TRIM_INTERVAL_S="0.2",
        IRREV_JOURNAL_ARCHIVE_DIR=str(tmp_path / "archive"),
    ) as gateway:
        yield gateway


async def test_gateway_archives_and_trims_old_journal_entries(
    trimming_gateway: Gateway, redis_url: str, tmp_path: Path
) -> None:
    tenant: Tenant = trimming_gateway.tenant("own")
    deploy = {"tool": "deploy", "method": "POST", "path": "/deploys"}
    async with httpx.AsyncClient(base_url=trimming_gateway.url, trust_env=False) as http:
        for i in range(40):
            headers = {**tenant.auth("deployer-01"), "Idempotency-Key": f"d-{i}"}
            created = await http.post("/v1/holds", json=deploy, headers=headers)
            assert created.status_code in (201, 202, 403), created.text
            if created.status_code == 201:
                hold = created.json()["hold"]
                posted = await http.post(f"/v1/holds/{hold}/post", json={}, headers=headers)
                assert posted.status_code == 200, posted.text

        redis = redis_client(redis_url, decode_responses=True)
        try:
            deadline = time.monotonic() + 30
            while await redis.xlen(journal_key(tenant.id)) > 0:
                assert time.monotonic() < deadline, "the journal was never trimmed"
                await asyncio.sleep(0.1)
            checkpoint = await load_checkpoint(Ledger(redis), tenant.id)
        finally:
            await redis.aclose()
        metrics = (await http.get("/metrics", headers=trimming_gateway.admin)).text

    lines = archive_path(tmp_path / "archive", tenant.id).read_text().splitlines()
    archived = [json.loads(line) for line in lines]
    ids = [(int(a["id"].split("-")[0]), int(a["id"].split("-")[1])) for a in archived]
    assert ids == sorted(set(ids)), "an entry archived twice or out of order"
    ops = [a["op"] for a in archived]
    assert ops.count("reserve") == 40 and ops.count("post") >= 1
    assert checkpoint.upto == archived[-1]["id"]
    trimmed = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(f'irrev_journal_trimmed_total{{tenant="{tenant.id}"}}')
    )
    assert trimmed == len(archived)
    audit = ledger_audit(redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr
