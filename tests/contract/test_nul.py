"""U+0000 in results, args and resource ids: kept exactly on every store (issue 10, item 11).

Canonical JSON writes it as the escape ``\\u0000``, which PostgreSQL's ``json``
and ``text`` columns keep like any other text. Only the ``jsonb`` error
column cannot hold it, so error text gets U+FFFD instead.
"""

from __future__ import annotations

import json

from agent_ledger import Effect, EffectStatus, JSONValue, ToolCall
from agent_ledger.calls import ResourceDescriptor
from tests.harness import StoreHarness

RESULT = {"text": "a\x00b", "k\x00": ["\x00", "x"]}


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, effect: Effect) -> object:
        self.calls += 1
        return RESULT


async def test_nul_in_a_result_is_recorded_and_replayed_exactly(harness: StoreHarness) -> None:
    """A result holding U+0000 is recorded as succeeded (the side effect happened) and
    comes back exactly, fresh and on replay."""
    ledger = harness.ledger()
    call = ToolCall(workflow_id="wf", tool="echo", args={})
    handler = Counter()
    assert await ledger.run(call, handler) == RESULT
    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert effect is not None
    assert (effect.status, effect.result, effect.error) == (EffectStatus.SUCCEEDED, RESULT, None)
    assert await ledger.run(call, handler) == RESULT
    assert handler.calls == 1


async def test_nul_in_args_round_trips_and_tells_calls_apart(harness: StoreHarness) -> None:
    """Args holding U+0000 (in values and names) are stored exactly, and differ from the
    same args with another character there."""
    ledger = harness.ledger()
    args: dict[str, JSONValue] = {"to": "ada\x00", "k\x00": ["\x00"]}
    calls = [
        ToolCall(workflow_id="wf", tool="send", args=args),
        ToolCall(workflow_id="wf", tool="send", args={"to": "ada\x01", "k\x00": ["\x00"]}),
        ToolCall(workflow_id="wf", tool="send", args={"to": "ada", "k\x00": ["\x00"]}),
    ]
    assert len({ledger.idem_key(call) for call in calls}) == 3
    handler = Counter()
    for call in calls:
        await ledger.run(call, handler)
    assert handler.calls == 3
    effect = await ledger.find_by_idem_key(ledger.idem_key(calls[0]))
    assert effect is not None and json.loads(effect.args_canonical) == args
    await ledger.run(calls[0], handler)  # a replay, found by the key with U+0000 in it
    assert handler.calls == 3
    assert await harness.raw_count() == 3


async def test_nul_in_a_resource_id_round_trips_and_tells_calls_apart(
    harness: StoreHarness,
) -> None:
    """A resource id holding U+0000 is stored exactly and is its own effect."""
    ledger = harness.ledger()

    def on(title: str) -> ToolCall:
        resource = ResourceDescriptor("github", "issue", {"title": title})
        return ToolCall(workflow_id="wf", tool="issue.create", resource=resource)

    handler = Counter()
    await ledger.run(on("bug\x00"), handler)
    await ledger.run(on("bug\x01"), handler)
    await ledger.run(on("bug\x00"), handler)
    assert handler.calls == 2
    effect = await ledger.find_by_idem_key(ledger.idem_key(on("bug\x00")))
    assert effect is not None and effect.resource_id_canonical is not None
    assert json.loads(effect.resource_id_canonical)["id"] == {"title": "bug\x00"}
