"""Outages: the link between a ledger and PostgreSQL drops during begin, the handler
or the commit, for 0.5 s, 3 s, or longer than the lease.

The owner's store reaches PostgreSQL through a :class:`~tests.tcp_proxy.TcpProxy`,
with a warm pool (every connection open and idle, so every one is cut). The
outage starts as the owner's first ``begin`` or ``commit`` is sent, or once
all its handlers run (they then run through the whole outage, so it hits
their heartbeats). Three keys go through each case at once. The rest of the
fleet reaches PostgreSQL directly: as the link drops, a duplicate caller
asks for every key, as an agent retrying on a healthy worker would, and
takes an effect over once its lease has run out. An owner that saw an error
calls again once the link is back.

Figures: handler executions per key, lost effects (not terminal once
everything recovered), and the errors callers saw. The guarantee checked:

* an outage shorter than the lease never runs a handler twice, in any phase,
  and costs no effect; during commit, the owner keeps retrying (the lease
  is still its own) and gets its result;
* an outage longer than the lease may cost one documented takeover (the
  owner could not show it was alive for a whole lease, as after a crash):
  at most two executions, the second by a later attempt that fenced the
  first off, every caller told the receipt's result, and no effect lost.

``AGENT_LEDGER_TEST_DSN`` must be a URL (``postgresql://user@host:port/db``):
the proxy takes its host and port.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from agent_ledger import Effect, EffectError, EffectLedger, EffectStatus, RunOptions, ToolCall
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.base import BeginOutcome, NewEffect
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import FaultyStore, build_ledger
from tests.reliability.conftest import report
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: The owner's lease (StaleOptions.after_ms): heartbeats go out every third of it.
LEASE_S = 6.0
OUTAGES = {"0.5s": 0.5, "3s": 3.0, "7.5s": LEASE_S + 1.5}  # the last outlives the lease
PHASES = ["begin", "handler", "commit"]
KEYS = 3
#: The owner's pool: ten connections (``connect()``'s default max_size), all open
#: and idle when the link drops, as in a warm application; every one is cut.
POOL = 10
HANDLER_S = 0.2
#: No case may take longer than this (a hang fails the test instead of the tier).
CASE_TIMEOUT_S = 90.0
OPTIONS = RunOptions(
    stale=StaleOptions(after_ms=int(LEASE_S * 1000)),
    concurrency=ConcurrencyOptions(
        wait_timeout_ms=int(LEASE_S * 4000), initial_interval_ms=20, max_interval_ms=250
    ),
)


def through(dsn: str, port: int) -> str:
    """``dsn`` with its host and port replaced by the proxy's."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    hostport = f"127.0.0.1:{port}"
    return urlunsplit(
        parts._replace(netloc=f"{netloc[0]}@{hostport}" if len(netloc) == 2 else hostport)
    )


class OutageAt(FaultyStore[PostgresStore]):
    """The owner's store: drops the proxy's link as the chosen step is first sent."""

    def __init__(self, inner: PostgresStore, proxy: TcpProxy, phase: str, seconds: float) -> None:
        super().__init__(inner)
        self.proxy = proxy
        self.phase = phase
        self.seconds = seconds
        self.dropped = asyncio.Event()
        self.dropped_at = 0.0

    def trigger(self, step: str) -> None:
        if step == self.phase and not self.dropped.is_set():
            self.dropped_at = time.monotonic()
            self.proxy.drop(self.seconds)
            self.dropped.set()

    async def begin(
        self, new: NewEffect, *, tx: object | None = None, lock_timeout_ms: int | None = None
    ) -> BeginOutcome:
        self.trigger("begin")
        return await super().begin(new, tx=tx, lock_timeout_ms=lock_timeout_ms)

    async def commit(
        self,
        effect_id: str,
        *,
        attempt: int | None,
        status: EffectStatus,
        result_json: str | None,
        error: EffectError | None,
        tx: object | None = None,
        ends_try: bool = True,
        usage_json: str | None = None,
        started: bool = True,
        retryable: bool = False,
    ) -> bool:
        self.trigger("commit")
        return await super().commit(
            effect_id,
            attempt=attempt,
            status=status,
            result_json=result_json,
            error=error,
            tx=tx,
            ends_try=ends_try,
            usage_json=usage_json,
            started=started,
            retryable=retryable,
        )


class Case:
    """One outage: the owner's and the fleet's ledgers, and what their callers saw."""

    def __init__(self, owner: EffectLedger, fleet: EffectLedger, store: OutageAt) -> None:
        self.owner = owner
        self.fleet = fleet
        self.store = store
        self.tag = uuid.uuid4().hex[:8]
        self.executions: Counter[int] = Counter()
        self.ran_by: dict[int, list[str]] = {}
        self.errors: Counter[str] = Counter()
        self.results: dict[int, list[Any]] = {}
        self._handlers_started = 0
        #: When the last caller finished.
        self.done_at = 0.0

    def call(self, i: int) -> ToolCall:
        return ToolCall(workflow_id=f"outage-{self.tag}", tool="charge", args={"i": i})

    async def handler(self, effect: Effect, i: int, who: str) -> dict[str, Any]:
        self.executions[i] += 1
        self.ran_by.setdefault(i, []).append(f"{who}#{effect.attempt}")
        if who == "owner" and self.store.phase == "handler":
            # Once every key's handler runs (so no begin is in flight), drop the
            # link; run through the whole outage, so it lands on the heartbeats.
            self._handlers_started += 1
            if self._handlers_started == KEYS:
                self.store.trigger("handler")
            await asyncio.sleep(self.store.seconds + 0.5)
        else:
            await asyncio.sleep(HANDLER_S)
        return {"i": i, "by": who, "attempt": effect.attempt}

    async def run(self, ledger: EffectLedger, i: int, who: str) -> bool:
        """One caller's run(); False if it raised (counted by error type)."""
        try:
            result = await ledger.run(self.call(i), lambda e: self.handler(e, i, who), OPTIONS)
        except Exception as exc:
            self.errors[f"{who}: {type(exc).__name__}"] += 1
            return False
        finally:
            self.done_at = max(self.done_at, time.monotonic())
        self.results.setdefault(i, []).append(result)
        return True

    async def owner_with_retry(self, i: int) -> None:
        """The owner's call; after an error, call again once the link is back."""
        if not await self.run(self.owner, i, "owner"):
            await self.store.proxy.wait_up()
            await self.run(self.owner, i, "owner (retry)")

    async def duplicate(self, i: int) -> None:
        await self.store.dropped.wait()
        await self.run(self.fleet, i, "duplicate")


@pytest.mark.parametrize("outage", list(OUTAGES))
@pytest.mark.parametrize("phase", PHASES)
async def test_outage(dsn: str, schema: str, phase: str, outage: str) -> None:
    """The link drops during `phase` for `outage`: executions, lost effects, errors."""
    seconds = OUTAGES[outage]
    upstream = urlsplit(dsn)
    proxy = await TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432).start()
    inner = await PostgresStore.connect(
        through(dsn, proxy.port), schema=schema, min_size=POOL, max_size=POOL
    )
    store = OutageAt(inner, proxy, phase, seconds)
    direct = await PostgresStore.connect(dsn, schema=schema, min_size=1, max_size=4)
    case = Case(build_ledger(store), build_ledger(direct), store)
    started = time.monotonic()
    try:
        async with asyncio.timeout(CASE_TIMEOUT_S):
            await asyncio.gather(
                *(case.owner_with_retry(i) for i in range(KEYS)),
                *(case.duplicate(i) for i in range(KEYS)),
            )
            effects = [
                await case.fleet.find_by_idem_key(case.fleet.idem_key(case.call(i)))
                for i in range(KEYS)
            ]
    finally:
        await store.close()
        await direct.close()
        await proxy.close()
    lost = [i for i, e in enumerate(effects) if e is None or not e.status.is_terminal]
    mismatched = [
        i
        for i, e in enumerate(effects)
        if e is not None and any(r != e.result for r in case.results.get(i, []))
    ]
    executions = [case.executions[i] for i in range(KEYS)]
    past = f" (past the {LEASE_S:g}s lease)" if seconds > LEASE_S else ""
    report(
        f"outage {outage}{past} during {phase}",
        keys=KEYS,
        executions_per_key=executions,
        ran_by=[case.ran_by.get(i) for i in range(KEYS)],
        lost=len(lost),
        errors_seen=dict(case.errors),
        results_mismatched=len(mismatched),
        links_cut=proxy.cut,
        connections_refused=proxy.refused,
        # From the link coming back to the last caller's answer.
        recovered_after_s=round(case.done_at - store.dropped_at - seconds, 1),
        seconds=round(time.monotonic() - started, 1),
    )
    assert store.dropped.is_set()
    assert (lost, mismatched) == ([], []), "lost effects / callers told another result"
    if seconds < LEASE_S:
        assert executions == [1] * KEYS, "an outage shorter than the lease ran a handler twice"
        if phase == "commit":
            assert not case.errors, "the owner's commit gave up while its lease was live"
    else:
        assert max(executions) <= 2, "more than one takeover"
        for i in range(KEYS):
            attempts = [int(ran.rsplit("#", 1)[1]) for ran in case.ran_by.get(i, [])]
            # A second execution is a takeover: a later attempt, which fenced off the first.
            assert len(set(attempts)) == len(attempts), (i, case.ran_by.get(i))
