"""Binding: one call however it is spelled; defaults before the key; bad calls store nothing."""

from __future__ import annotations

from typing import Any

import pytest

from agent_ledger import Effect, EffectLedger, EffectLedgerValidationError, MemoryStore
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness


def _counting(ledger: EffectLedger, runs: list[dict[str, Any]]) -> Any:
    @ledger.tool("calc.add")
    async def add(a: int, b: int, c: int = 10) -> int:
        runs.append({"a": a, "b": b, "c": c})
        return a + b + c

    return add


async def test_positional_and_keyword_spellings_are_one_call(harness: StoreHarness) -> None:
    """f(1, 2), f(a=1, b=2), f(b=2, a=1) and f(1, b=2) run once."""
    ledger = harness.ledger()
    runs: list[dict[str, Any]] = []
    add = _counting(ledger, runs)
    async with ledger.workflow("w"):
        results = [await add(1, 2), await add(a=1, b=2), await add(b=2, a=1), await add(1, b=2)]
    assert results == [13, 13, 13, 13]
    assert len(runs) == 1
    assert await harness.raw_count() == 1


async def test_defaults_are_part_of_the_key() -> None:
    """Leaving a default out and passing it explicitly are one call; another value is not."""
    ledger = build_ledger(MemoryStore())
    runs: list[dict[str, Any]] = []
    add = _counting(ledger, runs)
    async with ledger.workflow("w"):
        await add(1, 2)
        await add(1, 2, 10)
        await add(1, 2, c=10)
        await add(1, 2, 11)
        key = ledger.idem_key(add.tool_call(1, 2))
    assert runs == [{"a": 1, "b": 2, "c": 10}, {"a": 1, "b": 2, "c": 11}]
    effect = await ledger.find_by_idem_key(key)
    assert effect is not None and effect.args == {"a": 1, "b": 2, "c": 10}


async def test_positional_only_parameters_bind_and_are_passed_by_position() -> None:
    """def f(a, /, b) works: keyed by name, called positionally."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t")
    def f(a: int, /, b: int) -> list[int]:
        return [a, b]

    async with ledger.workflow("w"):
        assert await f(1, 2) == [1, 2]
        assert await f(1, b=2) == [1, 2]
        with pytest.raises(EffectLedgerValidationError, match="positional-only"):
            await f(a=1, b=2)
    assert (await ledger.stats()).total == 1


async def test_effect_parameter_receives_the_effect_and_is_not_an_arg(
    harness: StoreHarness,
) -> None:
    """A keyword-only `effect` gets the Effect; it is not stored among the args."""
    ledger = harness.ledger()
    seen: list[Effect] = []

    @ledger.tool("psp.charge")
    async def charge(order_id: str, amount: int, *, effect: Effect) -> str:
        seen.append(effect)
        return effect.idem_key

    async with ledger.workflow("order-42"):
        key = await charge("o42", amount=4999)
    [effect] = seen
    assert key == effect.idem_key
    assert effect.args == {"order_id": "o42", "amount": 4999}
    stored = await ledger.find_by_idem_key(key)
    assert stored is not None and stored.args == {"order_id": "o42", "amount": 4999}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1, 2, 3, 4), {}, "positional arguments"),
        ((1,), {}, r"missing required arguments \['b'\]"),
        ((1, 2), {"d": 4}, "unexpected keyword argument 'd'"),
        ((1, 2), {"a": 1}, "multiple values for argument 'a'"),
        ((1, object()), {}, "not a JSON value"),
        ((1, float("nan")), {}, "NaN"),
    ],
    ids=["too-many", "missing", "unknown", "repeated", "not-json", "nan"],
)
async def test_bad_calls_raise_and_store_nothing(
    harness: StoreHarness, args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    """Unknown, missing, repeated or non-JSON arguments raise before anything is stored."""
    ledger = harness.ledger()
    runs: list[dict[str, Any]] = []
    add = _counting(ledger, runs)
    async with ledger.workflow("w"):
        with pytest.raises(EffectLedgerValidationError, match=message):
            await add(*args, **kwargs)
    assert runs == []
    assert await harness.raw_count() == 0


async def test_passing_effect_yourself_is_refused() -> None:
    """effect=... from the caller is refused: the ledger passes it."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t")
    async def f(a: int, *, effect: Effect) -> int:
        return a

    async with ledger.workflow("w"):
        with pytest.raises(EffectLedgerValidationError, match="effect"):
            await f(1, effect=None)
    assert (await ledger.stats()).total == 0


async def test_idempotency_keys_pick_the_args_that_make_the_key() -> None:
    """With idempotency_keys, calls differing only in other args are one effect."""
    ledger = build_ledger(MemoryStore())
    runs: list[str] = []

    @ledger.tool("mail.send", idempotency_keys=["to"])
    async def send(to: str, body: str) -> str:
        runs.append(body)
        return body

    async with ledger.workflow("w"):
        assert await send("a@b.c", "first draft") == "first draft"
        assert await send("a@b.c", body="second draft") == "first draft"
    assert runs == ["first draft"]


async def test_a_mutable_default_is_fresh_for_every_call() -> None:
    """A function that changes its default dict cannot change the next call's key."""
    ledger = build_ledger(MemoryStore())
    sent: list[str] = []

    @ledger.tool("mail.send", workflow_id="w")
    async def send(to: str, headers: dict[str, str] = {}) -> str:  # noqa: B006
        headers["X-Seen"] = "yes"  # a careless handler
        sent.append(to)
        return to

    assert ledger.idem_key(send.tool_call("ada")) == ledger.idem_key(send.tool_call("ada", {}))
    await send("ada")
    await send("ada")
    assert sent == ["ada"]
    assert send.tool_call("ada").args == {"to": "ada", "headers": {}}


async def test_invoke_refuses_options_that_are_not_run_options() -> None:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t", workflow_id="w")
    async def t() -> int:
        return 1

    with pytest.raises(EffectLedgerValidationError, match="run_options"):
        await t.invoke({}, run_options={"wait_for_approval": False})  # type: ignore[arg-type]


async def test_a_call_of_bound_values_is_the_call_its_arguments_make() -> None:
    """``call_of(bind_arguments(args))`` keys as ``call_for(args)``, so an adapter binds once."""
    ledger = build_ledger(MemoryStore())
    add = _counting(ledger, [])
    async with ledger.workflow("w"):
        values = add.bind_arguments({"a": 1, "b": 2})
        assert values == {"a": 1, "b": 2, "c": 10}
        bound = add.call_of(values, call_id="call-1")
        assert bound.call_id == "call-1"
        assert ledger.idem_key(bound) == ledger.idem_key(add.call_for({"b": 2, "a": 1}))
    with pytest.raises(EffectLedgerValidationError, match="outside a workflow"):
        add.call_of(values)
