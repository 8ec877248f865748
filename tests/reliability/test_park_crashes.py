"""Workers SIGKILLed inside an ``on_stale="park"`` tool's handler, after its side
effect, on PostgreSQL and SQLite: the effect is parked, never run again
automatically, and a person's resolve / approve / deny reaches every waiting
and later caller. A worker killed before its handler started is taken over.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import (
    EffectDeniedError,
    EffectLedger,
    EffectStatus,
    JSONValue,
    ToolCall,
    open_store,
)
from agent_ledger.effects import Parked, Settlement
from agent_ledger.status import AMBIGUOUS_ATTEMPT
from agent_ledger.testing import build_ledger
from tests.harness import DSN, TEST_SCHEMA, open_harness
from tests.reliability.conftest import report

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
AFTER_MS = 500
CALLERS = 2


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    async with open_harness("postgres"):  # empties this session's schema
        yield f"{DSN}?schema={TEST_SCHEMA}"


def worker(url: str, provider: Path, order: str, point: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.park_worker", url, str(provider), order,
         point, str(AFTER_MS)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


async def killed(process: subprocess.Popen[bytes]) -> None:
    _, err = await asyncio.to_thread(process.communicate, timeout=60)
    assert process.returncode == -9, err.decode()[-2000:]


async def answer(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    out, err = await asyncio.to_thread(process.communicate, timeout=60)
    assert process.returncode == 0, err.decode()[-2000:]
    outcome: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return outcome


def charges(provider: Path) -> int:
    return len(provider.read_text().splitlines()) if provider.exists() else 0


def call(order: str) -> ToolCall:
    return ToolCall(workflow_id="shop", tool="payments.charge", args={"order": order})


async def parked_effect(ledger: EffectLedger, order: str) -> Any:
    key = ledger.idem_key(call(order))
    for _ in range(600):
        effect = await ledger.find_by_idem_key(key)
        if effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL:
            return effect
        await asyncio.sleep(0.05)
    raise AssertionError(f"order {order} was never parked")


async def test_sigkill_inside_a_park_handler(url: str, tmp_path: Path) -> None:
    """Per settlement: a worker dies right after charging; waiting callers park the
    effect; nothing runs it again until a person settles it; then every caller gets
    the settled outcome and the provider saw exactly the charges that decision implies."""
    store = await open_store(url)
    ledger = build_ledger(store)
    figures = {"crashes": 0, "parked": 0, "settled": 0, "provider_charges": 0}
    max_executions_while_parked = 0
    try:
        for decision in ("resolve", "approve", "deny"):
            order = f"o-{decision}"
            provider = tmp_path / f"provider-{decision}.log"
            await killed(worker(url, provider, order, "inside"))
            figures["crashes"] += 1
            assert charges(provider) == 1
            callers = [worker(url, provider, order, "none") for _ in range(CALLERS)]
            parked = await parked_effect(ledger, order)
            figures["parked"] += 1
            assert parked.parked and parked.error.code == AMBIGUOUS_ATTEMPT
            assert parked.attempt == 1 and parked.executions == 1
            (event,) = parked.history
            assert isinstance(event, Parked) and event.worker and event.started_at
            # Nobody runs it again on their own: well past several leases, still parked.
            await asyncio.sleep(4 * AFTER_MS / 1000)
            still = await ledger.find_by_idem_key(parked.idem_key)
            assert still is not None and still.parked and still.executions == 1
            max_executions_while_parked = max(max_executions_while_parked, still.executions)
            assert charges(provider) == 1
            assert all(c.poll() is None for c in callers)  # waiting for a person

            if decision == "resolve":
                receipt: dict[str, JSONValue] = {"order": order, "charge": "ch_from_provider"}
                assert await ledger.resolve(
                    parked.idem_key, result=receipt, by="ops", note="seen at the provider",
                    expected_attempt=1,
                )  # fmt: skip
                outcomes = [await answer(c) for c in callers]
                assert outcomes == [{"result": receipt}] * CALLERS
                assert charges(provider) == 1
                late = await answer(worker(url, provider, order, "none"))
                assert late == {"result": receipt}
            elif decision == "approve":
                assert await ledger.approve(
                    parked.idem_key, by="ops", note="no charge at the provider", expected_attempt=1
                )
                outcomes = [await answer(c) for c in callers]
                assert outcomes[0] == outcomes[1] and outcomes[0]["result"]["charge"] == "ch_2"
                assert charges(provider) == 2  # once more, by exactly one caller
            else:
                assert await ledger.deny(
                    parked.idem_key, reason="refunded by hand", by="ops", expected_attempt=1
                )
                outcomes = [await answer(c) for c in callers]
                assert outcomes == [{"denied": "refunded by hand"}] * CALLERS
                with pytest.raises(EffectDeniedError):
                    await ledger.run(call(order), lambda effect: None)
                assert charges(provider) == 1
            figures["settled"] += 1
            figures["provider_charges"] += charges(provider)
            final = await ledger.find_by_idem_key(parked.idem_key)
            assert final is not None and final.status.is_terminal
            assert [type(e) for e in final.history] == [Parked, Settlement]
            # A second settle finds nothing to settle.
            assert not await ledger.approve(parked.idem_key, by="late", expected_attempt=1)
    finally:
        await store.close()
    report(
        f"ambiguous attempts parked (SIGKILL in an on_stale='park' handler, {url.split(':')[0]})",
        crashes=figures["crashes"],
        parked=figures["parked"],
        settled=figures["settled"],
        executions_while_parked_max=max_executions_while_parked,
        provider_charges=figures["provider_charges"],
        charges_implied=1 + 2 + 1,
    )


async def test_sigkill_before_the_handler_started_is_taken_over(url: str, tmp_path: Path) -> None:
    """Nothing can have happened: the next caller takes it over and runs it, once."""
    provider = tmp_path / "provider.log"
    await killed(worker(url, provider, "o-before", "before"))
    assert charges(provider) == 0
    outcome = await answer(worker(url, provider, "o-before", "none"))
    assert outcome["result"]["charge"] == "ch_2"  # attempt 2: a takeover
    assert charges(provider) == 1
    store = await open_store(url)
    try:
        effect = await build_ledger(store).find_by_idem_key(
            build_ledger(store).idem_key(call("o-before"))
        )
    finally:
        await store.close()
    assert effect is not None and effect.status is EffectStatus.SUCCEEDED
    assert not any(isinstance(e, Parked) for e in effect.history)
