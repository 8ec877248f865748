"""list_effects by handler time, error code and call id, on every store.

Handler time (``effects.handler_time``) runs from the claim that started the
current run to its recorded outcome, or to now while it runs; a wait for a
person never counts, and an effect whose run's end is unknown never matches.
Each store computes it itself (SQL, or the function for MemoryStore); this
suite holds them to one answer.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectLedgerValidationError,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from agent_ledger.audit import MAX_SPAN
from agent_ledger.effects import CommitSucceeded, handler_time
from tests.harness import StoreHarness


class Declined(Exception):
    code = "declined"


def call(name: str, call_id: str | None = None) -> ToolCall:
    return ToolCall(workflow_id="wf", tool=f"t.{name}", args={}, call_id=call_id)


async def populate(harness: StoreHarness) -> dict[str, str]:
    """One effect of each kind; returns tool name -> effect id.

    slow: ran 400 ms; running: still processing after 400 ms; fast: failed at
    once (code declined, call id call-b); approved: waited 400 ms for a person,
    then ran at once; pending: still waiting for a person; stopped: a person
    canceled it 400 ms into its run.
    """
    ledger = harness.ledger()
    running = await ledger.begin(call("running"))
    stopped = await ledger.begin(call("stopped"))
    asking = RunOptions(requires_approval=True, wait_for_approval=False)
    for name in ("approved", "pending"):
        with pytest.raises(ApprovalPendingError):
            await ledger.run(call(name), lambda e: "ran", asking)
    slow = await ledger.begin(call("slow"))
    await harness.age(400)  # the manual clocks of MemoryStore and SqliteStore
    await asyncio.sleep(0.4)  # PostgreSQL's own clock
    assert await ledger.commit(slow.effect.id, CommitSucceeded("done"), attempt=1)

    def decline(effect: Effect) -> None:
        raise Declined("card declined")

    with pytest.raises(Declined):
        await ledger.run(call("fast", call_id="call-b"), decline)
    assert await ledger.approve(ledger.idem_key(call("approved")), by="ops")
    assert await ledger.run(call("approved"), lambda e: "ran", asking) == "ran"
    assert await ledger.cancel(ledger.idem_key(call("stopped")), reason="too slow", by="ops")
    ids = {}
    for name, begun in (("running", running), ("stopped", stopped), ("slow", slow)):
        ids[name] = begun.effect.id
    for name in ("fast", "approved", "pending"):
        found = await ledger.find_by_idem_key(ledger.idem_key(call(name)))
        assert found is not None
        ids[name] = found.id
    return ids


async def names(harness: StoreHarness, **filters: object) -> set[str]:
    page = await harness.ledger().list_effects(limit=1_000, **filters)  # type: ignore[arg-type]
    return {effect.tool.removeprefix("t.") for effect in page.effects}


async def test_duration_error_code_and_call_id_filters(harness: StoreHarness) -> None:
    await populate(harness)
    ms = timedelta(milliseconds=1)
    # Handler time, never the wait for approval nor a run a person cut short.
    assert await names(harness, min_duration=300 * ms) == {"slow", "running"}
    assert await names(harness, max_duration=300 * ms) == {"fast", "approved"}
    assert await names(harness, min_duration=timedelta(0)) == {
        "slow",
        "running",
        "fast",
        "approved",
    }
    assert await names(harness, min_duration=300 * ms, max_duration=timedelta(hours=1)) == {
        "slow",
        "running",
    }
    assert await names(harness, min_duration=300 * ms, status="succeeded") == {"slow"}
    assert await names(harness, min_duration=timedelta(hours=1)) == set()
    assert await names(harness, error_code="declined") == {"fast"}
    assert await names(harness, error_code="declined", min_duration=300 * ms) == set()
    assert await names(harness, call_id="call-b") == {"fast"}
    assert await names(harness, call_id="call-x") == set()


async def test_every_store_agrees_with_handler_time(harness: StoreHarness) -> None:
    """The stores' SQL and the function give the same answer for every effect."""
    await populate(harness)
    page = await harness.ledger().list_effects(limit=1_000)
    bound = timedelta(milliseconds=300)
    for effect in page.effects:
        took = handler_time(effect, effect.heartbeat_at)
        expected = took is not None and took >= bound
        if effect.status is EffectStatus.PROCESSING:
            expected = True  # it has been running past the bound by now
        matched = await names(harness, min_duration=bound, tool=effect.tool)
        assert matched == ({effect.tool.removeprefix("t.")} if expected else set()), effect


@pytest.mark.parametrize(
    ("filters", "field"),
    [
        ({"min_duration": timedelta(seconds=-1)}, "min_duration"),
        ({"max_duration": 5}, "max_duration"),
        (
            {"min_duration": timedelta(seconds=2), "max_duration": timedelta(seconds=1)},
            "min_duration",
        ),
        ({"error_code": 7}, "error_code"),
        ({"call_id": b"x"}, "call_id"),
        # NUL and lone surrogates: PostgreSQL raised, SQLite and memory answered "none".
        ({"error_code": "bad\x00code"}, "error_code"),
        ({"call_id": "a\x00b"}, "call_id"),
        ({"tool": "a\x00b"}, "tool"),
        ({"workflow_id": "a\x00b"}, "workflow_id"),
        ({"tool": "a\ud800b"}, "tool"),
        ({"error_code": "\udfff"}, "error_code"),
        # Past MAX_SPAN: SQLite overflowed, PostgreSQL refused, memory answered.
        ({"min_duration": MAX_SPAN + timedelta(microseconds=1)}, "min_duration"),
        ({"min_duration": timedelta(days=999_999_999)}, "min_duration"),
        ({"max_duration": timedelta.max}, "max_duration"),
    ],
)
async def test_bad_filters_are_refused(
    harness: StoreHarness, filters: dict[str, object], field: str
) -> None:
    with pytest.raises(EffectLedgerValidationError) as info:
        await harness.ledger().list_effects(**filters)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_the_longest_span_gives_one_answer_on_every_store(harness: StoreHarness) -> None:
    """``MAX_SPAN`` itself is a filter every store can hold, with the same answer."""
    await populate(harness)
    assert await names(harness, min_duration=MAX_SPAN) == set()
    # Every effect whose handler time is known (not "stopped": see populate).
    assert await names(harness, max_duration=MAX_SPAN) == {"slow", "fast", "approved", "running"}
    assert await harness.ledger().purge(older_than=MAX_SPAN) == 0


@pytest.mark.parametrize("name", ["min_duration", "max_duration"])
async def test_spans_past_the_bound_name_field_and_limit(harness: StoreHarness, name: str) -> None:
    with pytest.raises(EffectLedgerValidationError, match=f"{name} must be at most 365000 days"):
        await harness.ledger().list_effects(**{name: timedelta(days=999_999_999)})  # type: ignore[arg-type]


async def test_a_code_stored_with_u_fffd_is_found_by_what_was_stored(
    harness: StoreHarness,
) -> None:
    """An error code with NUL is stored with U+FFFD in its place (EffectError), and
    found by that text; asked for with NUL, every store refuses alike."""
    ledger = harness.ledger()

    def boom(effect: Effect) -> None:
        error = Declined("x")
        error.code = "bad\x00code"
        raise error

    with pytest.raises(Declined):
        await ledger.run(call("nul"), boom)
    assert await names(harness, error_code="bad\ufffdcode") == {"nul"}
    with pytest.raises(EffectLedgerValidationError, match=r"the ledger stored them as U\+FFFD"):
        await names(harness, error_code="bad\x00code")
