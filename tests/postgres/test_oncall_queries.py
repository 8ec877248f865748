"""The PostgreSQL page's on-call queries answer their questions on a real database.

Each query of "For the person on call" (docs/postgres.md) runs, as the page
prints it, against the docs' schema holding effects in every state it must
tell apart: a stuck holder beside a live one, an approval left unclaimed,
two pending approvals of different ages, a takeover beside an approval that
ran (both at attempt 2), and tools that failed, retried, or succeeded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agent_ledger import EffectLedger, RetryPolicy, RunOptions, ToolCall
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import NewEffect
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.test_docs import DOCS_SCHEMA, _blocks, _docs_schema

ROOT = Path(__file__).resolve().parents[2]


def _oncall_queries() -> list[str]:
    (block,) = [b for b in _blocks(ROOT / "docs" / "postgres.md", "sql") if "Stuck:" in b]
    # A statement ends with ";" at the end of a line (comments have some inside).
    return [s for s in re.split(r";$", block, flags=re.M) if s.strip()]


def _new(key: str, tool: str, *, lease_ms: int = 15_000, approval: bool = False) -> NewEffect:
    return NewEffect(
        idem_key=key,
        workflow_id="oncall",
        call_id=None,
        tool=tool,
        args_canonical="{}",
        resource_id_canonical=None,
        requires_approval=approval,
        lease_ms=lease_ms,
    )


class Flaky(Exception):
    pass


async def _scenario(store: PostgresStore, conn: psycopg.Connection[Any]) -> None:
    effects = sql.Identifier(DOCS_SCHEMA, "agent_ledger_effects")

    def older(key: str, column: str, interval: str) -> None:
        conn.execute(
            sql.SQL("UPDATE {} SET {} = {} - %s::interval WHERE idem_key = %s").format(
                effects, sql.Identifier(column), sql.Identifier(column)
            ),
            (interval, key),
        )

    # Stuck: silent past its 1 s lease; the live one heartbeats within its lease.
    await store.begin(_new("stuck", "deploy", lease_ms=1000))
    older("stuck", "heartbeat_at", "1 minute")
    await store.begin(_new("alive", "deploy"))
    # Approved ten minutes ago, never claimed.
    ledger: EffectLedger = build_ledger(store)
    await store.begin(_new("approved", "refund", approval=True))
    await ledger.approve("approved", by="ops")
    older("approved", "updated_at", "10 minutes")
    # Two waiting for a person: the older is the one to show.
    await store.begin(_new("waits-long", "wire", approval=True))
    older("waits-long", "updated_at", "2 hours")
    await store.begin(_new("waits-short", "wire", approval=True))
    # A takeover: silent past its lease, claimed by another worker, finished.
    taken = await store.begin(_new("taken", "charge", lease_ms=1000))
    older("taken", "heartbeat_at", "1 minute")
    claimed = await store.claim("taken", stale_after_ms=1000)
    assert claimed.claimed and claimed.effect is not None and claimed.effect.attempt == 2
    assert await store.commit(
        claimed.effect.id, attempt=2, status=EffectStatus.SUCCEEDED, result_json="{}", error=None
    )
    assert taken.effect.attempt == 1
    # Approved and run: attempt 2 too, but no takeover.
    await store.begin(_new("approved-ran", "charge", approval=True))
    await ledger.approve("approved-ran", by="ops")
    ran = await store.claim("approved-ran", stale_after_ms=1000)
    assert ran.claimed and ran.effect is not None and ran.effect.attempt == 2
    # Failures: "mail" fails once of two; "sms" succeeds after one failed try.
    mail = [ToolCall(workflow_id="oncall", tool="mail", args={"n": n}) for n in range(2)]
    await ledger.run(mail[0], lambda e: {"sent": True})

    def bounce(effect: object) -> None:
        raise RuntimeError("bounced")

    with pytest.raises(RuntimeError, match="bounced"):
        await ledger.run(mail[1], bounce)
    tries = iter([True, False])

    def flaky(effect: object) -> dict[str, bool]:
        if next(tries):
            raise Flaky("once")
        return {"sent": True}

    retry = RunOptions(retry=RetryPolicy(on=Flaky, attempts=2, initial_ms=1, jitter=0.0))
    sms = ToolCall(workflow_id="oncall", tool="sms", args={})
    assert await ledger.run(sms, flaky, retry) == {"sent": True}


async def test_each_oncall_query_answers_its_question() -> None:
    queries = _oncall_queries()
    assert len(queries) == 4
    with _docs_schema() as conn:
        from tests.harness import DSN

        store = await PostgresStore.connect(DSN, schema=DOCS_SCHEMA)
        try:
            await store.create_schema()
            await _scenario(store, conn)
        finally:
            await store.close()
        stuck, oldest, takeovers, failures = (conn.execute(q).fetchall() for q in queries)

    assert [(r[0], r[3]) for r in stuck] == [("stuck", "processing"), ("approved", "ready")]
    assert [(r[0], r[2]) for r in oldest] == [("waits-long", "wire")]
    assert oldest[0][5] is False  # waiting for an approval, not parked
    assert [(r[1], r[2]) for r in takeovers] == [("charge", 1)]
    by_tool = {r[0]: r[1:] for r in failures}
    assert set(by_tool) == {"mail", "sms", "charge"}
    failed, ended, rate, failed_tries = by_tool["mail"]
    assert (failed, ended, float(rate)) == (1, 2, 0.5)
    assert failed_tries == 0, "a last try that fails ends the effect; it is not a retried try"
    assert by_tool["sms"][0] == 0 and by_tool["sms"][3] == 1
