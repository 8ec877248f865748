"""Handlers read their call's args from the effect (issue 10, item 20)."""

from __future__ import annotations

import asyncio

from agent_ledger import Effect, JSONValue, RunOptions, ToolCall
from agent_ledger.calls import ResourceDescriptor
from tests.approvals import make_pending
from tests.harness import StoreHarness

ARGS: dict[str, JSONValue] = {"to": "ada@example.com", "cc": ["bob"], "n": 1.5}
CALL = ToolCall(workflow_id="wf", tool="email.send", args=ARGS)


async def test_a_handler_reads_args_and_resource_from_the_effect(harness: StoreHarness) -> None:
    """effect.args is the call's args and effect.resource its resource, decoded."""
    ledger = harness.ledger()
    resource = ResourceDescriptor("github", "issue", {"repo": "acme/app", "n": 7})
    on_resource = ToolCall(
        workflow_id="wf", tool="issue.create", args={"title": "t"}, resource=resource
    )
    seen: list[tuple[object, object]] = []

    def handler(effect: Effect) -> str:
        seen.append((effect.args, effect.resource))
        return "ok"

    await ledger.run(CALL, handler)
    await ledger.run(on_resource, handler)
    assert seen == [
        (ARGS, None),
        (
            {"title": "t"},
            {"namespace": "github", "type": "issue", "id": {"repo": "acme/app", "n": 7}},
        ),
    ]
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and (stored.args, stored.resource) == (ARGS, None)


async def test_args_are_a_fresh_copy_on_every_access(harness: StoreHarness) -> None:
    """A handler that changes its args changes neither the receipt nor the next read."""
    ledger = harness.ledger()

    def meddle(effect: Effect) -> JSONValue:
        args = effect.args
        args["to"] = "mallory@example.com"
        cc = args["cc"]
        assert isinstance(cc, list)
        cc.append("eve")
        return effect.args

    assert await ledger.run(CALL, meddle) == ARGS
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and stored.args == ARGS
    assert stored.args is not stored.args


async def test_args_reach_the_handler_of_an_approved_effect(harness: StoreHarness) -> None:
    """The effect claimed after approve() carries the args too."""
    ledger = harness.ledger()
    key = (await make_pending(ledger, CALL)).idem_key
    assert await ledger.approve(key)
    seen: list[dict[str, JSONValue]] = []

    async def send(effect: Effect) -> str:
        seen.append(effect.args)
        return "sent"

    options = RunOptions(requires_approval=True)
    assert await asyncio.wait_for(ledger.run(CALL, send, options), 5) == "sent"
    assert seen == [ARGS]


async def test_args_from_begin_for_a_manual_worker(harness: StoreHarness) -> None:
    """begin() hands its worker an effect whose args it can execute from."""
    ledger = harness.ledger()
    begun = await ledger.begin(ToolCall(workflow_id="wf", tool="t", args={"pair": (1, 2)}))
    assert begun.effect.args == {"pair": [1, 2]}  # kept as JSON: a tuple reads back as a list
