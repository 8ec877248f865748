"""validate_keys: same key, other validated values: raises, runs nothing, changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_ledger import Effect, EffectLedger, EffectStatus, MemoryStore, ToolCall
from agent_ledger.errors import EffectPayloadMismatchError
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness


def _charge(ledger: EffectLedger, runs: list[int], gate: asyncio.Event | None = None) -> Any:
    @ledger.tool("psp.charge", idempotency_keys=["order_id"], validate_keys=["amount"])
    async def charge(order_id: str, amount: int, note: str = "") -> dict[str, int]:
        runs.append(amount)
        if gate is not None:
            await gate.wait()
        return {"charged": amount}

    return charge


def _same_except_dedup(before: Effect, after: Effect) -> None:
    assert after.dedup_count == before.dedup_count + 1
    for name in ("status", "args_canonical", "result", "attempt", "updated_at", "error"):
        assert getattr(after, name) == getattr(before, name), name


async def test_different_amount_raises_and_changes_nothing(harness: StoreHarness) -> None:
    """Same order, other amount: mismatch error with the stored effect; no run; record kept."""
    ledger = harness.ledger()
    runs: list[int] = []
    charge = _charge(ledger, runs)
    async with ledger.workflow("w"):
        assert await charge("o42", 4999) == {"charged": 4999}
        key = ledger.idem_key(charge.tool_call("o42", 4999))
        before = await ledger.find_by_idem_key(key)
        with pytest.raises(EffectPayloadMismatchError) as caught:
            await charge("o42", amount=5000)
    after = await ledger.find_by_idem_key(key)
    assert runs == [4999]
    assert caught.value.fields == ("amount",)
    assert caught.value.effect.idem_key == key and caught.value.effect.args["amount"] == 4999
    assert before is not None and after is not None
    _same_except_dedup(before, after)


async def test_a_field_outside_validate_keys_replays(harness: StoreHarness) -> None:
    """A different unvalidated arg (the note) is still the same call: the result replays."""
    ledger = harness.ledger()
    runs: list[int] = []
    charge = _charge(ledger, runs)
    async with ledger.workflow("w"):
        await charge("o42", 4999, note="first")
        assert await charge("o42", 4999, note="retry") == {"charged": 4999}
    assert runs == [4999]


async def test_validate_all_names_every_differing_field() -> None:
    """validate_keys="all" compares every arg and lists the ones that differ."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("mail.send", idempotency_keys=["to"], validate_keys="all")
    async def send(to: str, subject: str, body: str) -> str:
        return "sent"

    async with ledger.workflow("w"):
        await send("a@b.c", "hi", "body")
        assert await send("a@b.c", "hi", "body") == "sent"
        with pytest.raises(EffectPayloadMismatchError) as caught:
            await send("a@b.c", "hello", "other body")
    assert caught.value.fields == ("body", "subject")


async def test_json_equality_decides_a_mismatch() -> None:
    """Values compare as JSON, like keys: a tuple equals a list, 1 differs from 1.0."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t", idempotency_keys=["k"], validate_keys=["v"])
    async def t(k: str, v: object) -> str:
        return "ok"

    async with ledger.workflow("w"):
        await t("a", [1, {"x": 1, "y": 2}])
        assert await t("a", (1, {"y": 2, "x": 1})) == "ok"
        await t("b", 1)
        with pytest.raises(EffectPayloadMismatchError):
            await t("b", 1.0)


async def test_mismatch_does_not_wait_for_a_running_first_call(harness: StoreHarness) -> None:
    """While the first call still runs, a different amount is refused at once."""
    ledger = harness.ledger()
    runs: list[int] = []
    gate = asyncio.Event()
    charge = _charge(ledger, runs, gate)
    async with ledger.workflow("w"):
        first = asyncio.create_task(charge("o42", 4999))
        while not runs:
            await asyncio.sleep(0.005)
        with pytest.raises(EffectPayloadMismatchError) as caught:
            await asyncio.wait_for(charge("o42", 5000), timeout=5)
        gate.set()
        assert await first == {"charged": 4999}
    assert caught.value.effect.status is EffectStatus.PROCESSING
    assert runs == [4999]


async def test_concurrent_callers_with_different_amounts(harness: StoreHarness) -> None:
    """Exactly one executes; every other caller gets the mismatch, never its result."""
    ledger = harness.ledger()
    runs: list[int] = []
    charge = _charge(ledger, runs)
    async with ledger.workflow("w"):
        outcomes = await asyncio.gather(
            *(charge("o42", amount) for amount in (100, 200, 300, 400)), return_exceptions=True
        )
    assert len(runs) == 1
    [winner] = [o for o in outcomes if not isinstance(o, BaseException)]
    assert winner == {"charged": runs[0]}
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 3
    assert all(isinstance(e, EffectPayloadMismatchError) for e in errors)
    assert await harness.raw_count() == 1


async def test_plain_run_honours_validate_keys_on_the_tool_call(harness: StoreHarness) -> None:
    """ToolCall(validate_keys=...) works with run() too: the check is the ledger's."""
    ledger = harness.ledger()
    ran: list[int] = []

    async def handler(effect: Effect) -> str:
        ran.append(1)
        return "ok"

    def call(amount: int) -> ToolCall:
        return ToolCall(
            workflow_id="w",
            tool="psp.charge",
            args={"order_id": "o1", "amount": amount},
            idempotency_keys=["order_id"],
            validate_keys=["amount"],
        )

    await ledger.run(call(1), handler)
    with pytest.raises(EffectPayloadMismatchError):
        await ledger.run(call(2), handler)
    with pytest.raises(EffectPayloadMismatchError):
        await ledger.begin(call(2))
    assert ran == [1]


@pytest.mark.parametrize(
    "validate_keys", ["amount", [], ["amount", "amount"], ["missing"], [1]], ids=repr
)
def test_tool_call_checks_validate_keys(validate_keys: Any) -> None:
    """validate_keys is "all" or a list of distinct arg names, else refused."""
    from agent_ledger import EffectLedgerValidationError

    with pytest.raises(EffectLedgerValidationError, match="validate_keys"):
        ToolCall(workflow_id="w", tool="t", args={"amount": 1}, validate_keys=validate_keys)
