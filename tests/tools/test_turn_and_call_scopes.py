"""Tools keyed by intent: scope="turn" runs again in a later turn, scope="call" per
tool-call id, and Tool.call_outcome says when a call was answered from an earlier turn."""

from __future__ import annotations

import asyncio

import pytest

from agent_ledger import (
    EffectFailedError,
    EffectLedgerValidationError,
    MemoryStore,
    RetryableToolError,
)
from agent_ledger.adapters._messages import outcome_text
from agent_ledger.adapters._outcome import call_key, outcome_of
from agent_ledger.effects import Scoped
from agent_ledger.testing import build_ledger


async def test_the_same_request_in_a_later_turn_runs_again() -> None:
    """The story of issue 27: "remind Ada again" in a later turn sends again; a retry,
    or the model re-issuing the call, within the turn does not."""
    ledger = build_ledger(MemoryStore())
    sent: list[str] = []

    @ledger.tool("remind", scope="turn")
    async def remind(who: str) -> str:
        sent.append(who)
        return f"reminded {who}"

    async with ledger.workflow("thread-1", turn="msg-1"):
        assert await remind("ada") == "reminded ada"
        assert await remind("ada") == "reminded ada"
        assert list(await asyncio.gather(remind("ada"), remind("ada"))) == ["reminded ada"] * 2
    async with ledger.workflow("thread-1", turn="msg-2"):
        assert await remind("ada") == "reminded ada"
    async with ledger.workflow("thread-1", turn="msg-1"):
        assert await remind("ada") == "reminded ada"  # a resume of turn 1: its receipt
    assert sent == ["ada", "ada"]
    effects = (await ledger.list_effects()).effects
    assert sorted(e.turn or "" for e in effects) == ["msg-1", "msg-2"]
    assert all(e.scope == "turn" for e in effects)


async def test_a_turn_scoped_tool_outside_a_turn_says_how_to_supply_one() -> None:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("remind", scope="turn")
    async def remind(who: str) -> str:
        return "x"

    async with ledger.workflow("thread-1"):
        with pytest.raises(EffectLedgerValidationError, match=r"ledger.workflow\('thread-1', turn"):
            await remind("ada")
    assert (await ledger.list_effects()).effects == []


async def test_a_turn_belongs_to_its_workflow() -> None:
    """A tool pinned to another workflow is not in the block's turn."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("audit", workflow_id="audit-log")
    async def audit(line: str) -> str:
        return line

    async with ledger.workflow("thread-1", turn="t1"):
        await audit("hello")
        async with ledger.workflow("inner"):  # no turn here
            call = audit.tool_call("x")
    (effect,) = (await ledger.list_effects()).effects
    assert effect.turn is None and effect.scoped is None
    assert call.turn is None


async def test_call_scope_keys_by_the_frameworks_tool_call_id() -> None:
    ledger = build_ledger(MemoryStore())
    runs: list[str] = []

    @ledger.tool("charge", scope="call")
    async def charge(amount: int) -> int:
        runs.append("x")
        return amount

    async with ledger.workflow("thread-1"):
        assert await charge.invoke({"amount": 5}, call_id="call_a") == 5
        assert await charge.invoke({"amount": 5}, call_id="call_a") == 5
        assert await charge.invoke({"amount": 5}, call_id="call_b") == 5
        with pytest.raises(EffectLedgerValidationError, match="call_id") as info:
            await charge(5)
    assert info.value.field == "call_id"
    assert len(runs) == 2
    effect = ((await ledger.list_effects()).effects)[0]
    assert effect.call_id in {"call_a", "call_b"} and effect.scope == "call"


async def test_an_adapters_default_scope_applies_only_to_tools_that_declare_none() -> None:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("plain")
    async def plain(x: int) -> int:
        return x

    @ledger.tool("pinned", scope="workflow")
    async def pinned(x: int) -> int:
        return x

    async with ledger.workflow("w", turn="t1"):
        assert plain.call_for({"x": 1}, default_scope="turn").scope == "turn"
        assert pinned.call_for({"x": 1}, default_scope="turn").scope == "workflow"
        assert pinned.call_for({"x": 1}, scope="call", call_id="c").scope == "call"
        assert plain.call_for({"x": 1}).scope == "workflow"
        assert call_key(plain, {"x": 1}, default_scope="turn") != call_key(plain, {"x": 1})
        with pytest.raises(EffectLedgerValidationError, match="default_scope"):
            plain.call_for({"x": 1}, default_scope="thread")  # type: ignore[arg-type]


async def test_run_takes_scope_and_call_id() -> None:
    """ledger.run(..., scope=, call_id=) for code that calls the engine directly."""
    from agent_ledger import ToolCall

    ledger = build_ledger(MemoryStore())
    call = ToolCall("w", "t", {"a": 1})
    runs = 0

    def handler(effect: object) -> int:
        nonlocal runs
        runs += 1
        return runs

    assert await ledger.run(call, handler, scope="call", call_id="c1") == 1
    assert await ledger.run(call, handler, scope="call", call_id="c1") == 1
    assert await ledger.run(call, handler, scope="call", call_id="c2") == 2
    async with ledger.workflow("w", turn="t9"):
        assert await ledger.run(call, handler, scope="turn") == 3
        assert await ledger.run(call, handler, scope="turn") == 3
    with pytest.raises(EffectLedgerValidationError, match="scope must be one of"):
        await ledger.run(call, handler, scope="thread")  # type: ignore[call-overload]


async def test_call_outcome_tells_an_earlier_turns_receipt_from_a_fresh_run() -> None:
    """With the thread as the workflow and scope="workflow" (the default), a later
    turn's call is answered from the receipt: the outcome says so, with its time and
    key, and the one formatter says "already done" to the model."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("send")
    async def send(to: str) -> str:
        return f"sent to {to}"

    async with ledger.workflow("thread-1", turn="t1"):
        fresh = await send.call_outcome({"to": "ada"})
        again = await outcome_of(send, {"to": "ada"})
    async with ledger.workflow("thread-1", turn="t2"):
        later = await send.call_outcome({"to": "ada"})
    assert (fresh.replayed, fresh.from_earlier_turn, fresh.completed_at) == (False, False, None)
    assert (again.replayed, again.from_earlier_turn) == (True, False)
    assert (later.replayed, later.from_earlier_turn) == (True, True)
    assert later.result == "sent to ada" and later.ok
    assert later.effect_turn == "t1" and later.turn == "t2"
    assert later.completed_at is not None and later.idem_key == fresh.idem_key
    assert outcome_text(fresh, "sent to ada") == "sent to ada"
    assert outcome_text(again, "sent to ada") == "sent to ada"
    text = outcome_text(later, "sent to ada")
    assert text is not None and text.startswith("Already done at ")
    assert later.idem_key[:12] in text and text.endswith("sent to ada")
    assert f"{later.completed_at:%H:%M}" in text
    stored = await ledger.find_by_idem_key(fresh.idem_key)
    assert stored is not None and stored.history[0] == Scoped("workflow", "t1", None)


async def test_call_outcome_holds_the_tools_failure_and_whether_to_retry() -> None:
    ledger = build_ledger(MemoryStore())
    tries = 0

    @ledger.tool("lookup", retryable=(TimeoutError,))
    async def lookup(q: str) -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise TimeoutError("slow index")
        if tries == 2:
            raise RetryableToolError("ask for a narrower query")
        return "found"

    @ledger.tool("fails")
    async def fails(q: str) -> str:
        raise ValueError("no such table")

    async with ledger.workflow("w", turn="t1"):
        first = await lookup.call_outcome({"q": "x"})
        assert isinstance(first.error, TimeoutError) and first.retryable and not first.replayed
        text = outcome_text(first, "")
        assert text is not None and "may be retried" in text and "slow index" in text
        second = await lookup.call_outcome({"q": "x"})
        assert isinstance(second.error, RetryableToolError) and second.retryable
        third = await lookup.call_outcome({"q": "x"})
        assert third.ok and third.result == "found" and not third.replayed
        final = await fails.call_outcome({"q": "x"})
        assert isinstance(final.error, ValueError) and not final.retryable
        replay = await fails.call_outcome({"q": "x"})
        assert isinstance(replay.error, EffectFailedError) and replay.replayed
        assert not replay.retryable
        with pytest.raises(EffectFailedError):
            replay.unwrap()
    assert tries == 3


async def test_call_outcome_raises_what_is_not_the_tools_failure() -> None:
    """A nested tool's failure is the outer tool's failure; bad arguments raise."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("inner")
    async def inner(x: int) -> int:
        raise ValueError("inner broke")

    @ledger.tool("outer")
    async def outer(x: int) -> int:
        return await inner(x)

    async with ledger.workflow("w"):
        with pytest.raises(EffectLedgerValidationError):
            await outer.call_outcome({"y": 1})
        outcome = await outer.call_outcome({"x": 1})
    assert isinstance(outcome.error, ValueError) and not outcome.replayed
    assert outcome.effect is not None and outcome.effect.tool == "outer"


async def test_model_calls_record_the_turn_and_refuse_retryable() -> None:
    """ledger.llm() in a turn is keyed by it (scope "turn", the turn on its receipt),
    and refuses retryable=: each attempt is paid, and a receipt keeps one usage."""
    from agent_ledger import LLMResult, RunOptions, Usage

    ledger = build_ledger(MemoryStore())

    def call_fn(request: object) -> LLMResult:
        return LLMResult(response={"text": "hi"}, usage=Usage(1, 1))

    async with ledger.workflow("w", turn="t1"):
        reply = await ledger.llm(call_fn, provider="fake", model="m", request={"q": 1})
        with pytest.raises(EffectLedgerValidationError, match="retryable") as info:
            await ledger.llm(
                call_fn,
                provider="fake",
                model="m",
                request={"q": 2},
                run_options=RunOptions(retryable=(TimeoutError,)),
            )
    assert info.value.field == "retryable"
    (effect,) = (await ledger.list_effects()).effects
    assert effect.turn == "t1" and effect.scope == "turn"
    assert reply.response == {"text": "hi"}


async def test_a_retry_cancelled_in_flight_is_given_back_and_runs_once_later() -> None:
    """Cancelled while its retry step is in flight, the call gives back an attempt the
    step made its own (released, ready), so the next call runs it at once, once."""
    from agent_ledger.testing import FaultyStore

    store = FaultyStore(MemoryStore())
    ledger = build_ledger(store)
    runs: list[int] = []

    @ledger.tool("send", retryable=(ConnectionError,))
    async def send(to: str) -> str:
        runs.append(len(runs) + 1)
        if len(runs) == 1:
            raise ConnectionError("down")
        return "sent"

    async with ledger.workflow("w"):
        with pytest.raises(ConnectionError):
            await send("ada")
        store.slow("retry_failed", seconds=0.2)
        task = asyncio.create_task(send("ada"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store.heal("retry_failed")
        assert runs == [1]
        assert await send("ada") == "sent"
        assert await send("ada") == "sent"
    assert runs == [1, 2]
