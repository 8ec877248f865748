"""MCP: ledger tools on an MCPServer, called through the SDK's own client, in memory.

Every test connects a real ``mcp.Client`` to the server in the same process
(the SDK's in-memory path), so each call is a real ``tools/call`` request.
One test speaks JSON-RPC itself, to show that each response carries its own
request's id while the ledger runs the tool once.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.mcp.server import _MCPServerWithClientSession  # the SDK's client, in memory
from agents.testing import ScriptedModel, assistant_message
from agents.testing import function_call as agents_function_call
from mcp import Client
from mcp.client._memory import InMemoryTransport  # the SDK's in-memory transport for tests
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CallToolResult,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel

from agent_ledger import (
    ApprovalPendingError,
    Budget,
    Effect,
    EffectDeniedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    RunOptions,
    SqliteStore,
    ToolCall,
)
from agent_ledger.adapters.mcp import add_tool, add_tools
from agent_ledger.retries import RetryPolicy
from tests.harness import StoreHarness


def over_100(call: ToolCall) -> bool:
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


def shop(ledger: EffectLedger, runs: list[str], **options: Any) -> MCPServer:
    """A server with one ledger tool, payments.charge, keyed on the order."""

    @ledger.tool("payments.charge", idempotency_keys=["order_id"], requires_approval=over_100)
    async def charge(
        order_id: str, amount: int, currency: str = "EUR", *, effect: Effect
    ) -> dict[str, object]:
        """Charge an order once."""
        runs.append(order_id)
        return {"order": order_id, "amount": amount, "key": effect.idem_key[:8]}

    server = MCPServer("shop")
    add_tools(server, ledger, **({"workflow_id": "order-42"} | options))
    return server


def text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def stored(ledger: EffectLedger) -> list[Effect]:
    return (await ledger.list_effects()).effects


# -- schema and annotations ---------------------------------------------------------------


async def test_tools_list_shows_the_signature_and_idempotent_hint(harness: StoreHarness) -> None:
    """The input schema is the function's parameters without effect; idempotentHint is set."""
    ledger = harness.ledger()
    server = shop(ledger, [])
    async with Client(server) as client:
        (listed,) = (await client.list_tools()).tools
    assert listed.name == "payments_charge"  # a name model APIs take
    assert listed.description == "Charge an order once."
    assert set(listed.input_schema["properties"]) == {"order_id", "amount", "currency"}
    assert sorted(listed.input_schema["required"]) == ["amount", "order_id"]
    assert listed.input_schema["properties"]["currency"]["default"] == "EUR"
    assert listed.annotations is not None and listed.annotations.idempotent_hint is True


async def test_add_tool_takes_a_name_title_and_annotations(harness: StoreHarness) -> None:
    """Given annotations are kept, idempotentHint added unless they set it."""
    ledger = harness.ledger()

    @ledger.tool("notes.add")
    def add_note(text: str) -> str:
        return text

    @ledger.tool("notes.clear")
    def clear() -> None:
        """Clear every note."""

    server = MCPServer("notes")
    add_tool(
        server,
        add_note,
        name="add",
        title="Add a note",
        description="Adds one note.",
        annotations=ToolAnnotations(destructive_hint=False),
        workflow_id="w",
    )
    add_tool(server, clear, annotations=ToolAnnotations(idempotent_hint=False), workflow_id="w")
    async with Client(server) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert text(await client.call_tool("add", {"text": "hello"})) == "hello"
    add, cleared = listed["add"], listed["notes_clear"]
    assert (add.title, add.description) == ("Add a note", "Adds one note.")
    assert add.annotations == ToolAnnotations(destructive_hint=False, idempotent_hint=True)
    assert cleared.annotations == ToolAnnotations(idempotent_hint=False)
    assert cleared.description == "Clear every note."


# -- one execution, each request its own answer --------------------------------------------


async def test_five_duplicate_calls_run_once(harness: StoreHarness) -> None:
    """Five tools/call requests with the same arguments: one run, five equal results."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    async with Client(server) as client:
        results = [
            await client.call_tool("payments_charge", {"order_id": "o42", "amount": 5})
            for _ in range(5)
        ]
    assert runs == ["o42"]
    assert not any(r.is_error for r in results)
    assert len({text(r) for r in results}) == 1
    (effect,) = await stored(ledger)
    assert effect.status is EffectStatus.SUCCEEDED and effect.dedup_count == 4
    assert effect.call_id is not None  # the first request's id


async def test_each_response_carries_its_own_request_id(harness: StoreHarness) -> None:
    """Five concurrent JSON-RPC requests with ids call-0..4: five responses, each with its
    request's id, one run, and the id of the request that ran recorded as its call_id."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    async with InMemoryTransport(server) as (read, write):

        async def send(message: JSONRPCRequest | JSONRPCNotification) -> None:
            await write.send(SessionMessage(message))

        async def receive() -> JSONRPCResponse:
            message = await read.receive()
            assert isinstance(message, SessionMessage)
            assert isinstance(message.message, JSONRPCResponse), message
            return message.message

        hello = {"name": "test", "version": "1"}
        await send(
            JSONRPCRequest(
                jsonrpc="2.0",
                id="init",
                method="initialize",
                params={"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": hello},
            )
        )
        assert (await receive()).id == "init"
        await send(JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized"))
        arguments = {"order_id": "o1", "amount": 5}
        for i in range(5):
            await send(
                JSONRPCRequest(
                    jsonrpc="2.0",
                    id=f"call-{i}",
                    method="tools/call",
                    params={"name": "payments_charge", "arguments": arguments},
                )
            )
        responses = [await receive() for _ in range(5)]
    assert sorted(str(r.id) for r in responses) == [f"call-{i}" for i in range(5)]
    assert all(r.result["isError"] is False for r in responses)
    assert len({str(r.result["content"]) for r in responses}) == 1
    assert runs == ["o1"]
    (effect,) = await stored(ledger)
    assert effect.call_id in {f"call-{i}" for i in range(5)}  # whichever the server began first


async def test_concurrent_calls_from_one_client_run_once(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    async with Client(server) as client:
        results = await asyncio.gather(
            *(
                client.call_tool("payments_charge", {"order_id": "o2", "amount": 7})
                for _ in range(5)
            )
        )
    assert runs == ["o2"] and not any(r.is_error for r in results)
    assert await harness.raw_count() == 1


# -- what the client reads when nothing runs -----------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"order_id": "o1"}, "amount"),  # missing
        ({"order_id": "o1", "amount": "lots"}, "amount"),  # wrong type
        ({"order_id": "o1", "amount": 5, "amont": 5}, "unexpected arguments ['amont']"),
        ({"order_id": "o1", "amount": 5, "effect": "x"}, "unexpected arguments ['effect']"),
    ],
)
async def test_malformed_arguments_give_an_error_result_and_store_nothing(
    harness: StoreHarness, arguments: dict[str, Any], says: str
) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    async with Client(server) as client:
        result = await client.call_tool("payments_charge", arguments)
    assert result.is_error and says in text(result)
    assert runs == []
    assert await harness.raw_count() == 0


async def test_pending_then_denied_call_runs_nothing(harness: StoreHarness) -> None:
    """A call needing approval answers at once that it waits; after deny() the same call
    gets an error result saying so, every time, and nothing runs."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    big = {"order_id": "o9", "amount": 500}
    async with Client(server) as client:
        pending = await client.call_tool("payments_charge", big)
        assert pending.is_error and "waiting for it" in text(pending)
        (effect,) = await ledger.pending_approvals()
        assert await ledger.deny(effect.idem_key, reason="over budget", by="ops")
        denied = [await client.call_tool("payments_charge", big) for _ in range(2)]
    assert all(r.is_error and "denied this call (over budget)" in text(r) for r in denied)
    assert runs == []
    (effect,) = await stored(ledger)
    assert effect.status is EffectStatus.DENIED


async def test_approved_call_runs_once_when_sent_again(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    big = {"order_id": "o8", "amount": 500}
    async with Client(server) as client:
        assert (await client.call_tool("payments_charge", big)).is_error
        (effect,) = await ledger.pending_approvals()
        assert await ledger.approve(effect.idem_key, by="ops")
        results = [await client.call_tool("payments_charge", big) for _ in range(2)]
    assert not any(r.is_error for r in results)
    assert runs == ["o8"]


async def test_wait_for_approval_holds_the_request_until_a_decision(
    harness: StoreHarness,
) -> None:
    """wait_for_approval=True: the request waits for the person, then returns the result."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs, wait_for_approval=True)
    async with Client(server) as client:
        waiting = asyncio.create_task(
            client.call_tool("payments_charge", {"order_id": "o7", "amount": 500})
        )
        while not await ledger.pending_approvals():
            await asyncio.sleep(0.01)
        assert not waiting.done() and runs == []
        (effect,) = await ledger.pending_approvals()
        assert await ledger.approve(effect.idem_key)
        result = await asyncio.wait_for(waiting, 10)
    assert not result.is_error and runs == ["o7"]


async def test_payload_mismatch_is_an_error_result(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("payments.refund", idempotency_keys=["order_id"], validate_keys=["amount"])
    async def refund(order_id: str, amount: int) -> str:
        return f"refunded {amount}"

    server = MCPServer("shop")
    add_tool(server, refund, workflow_id="w")
    async with Client(server) as client:
        assert text(await client.call_tool("payments_refund", {"order_id": "o", "amount": 1}))
        other = await client.call_tool("payments_refund", {"order_id": "o", "amount": 2})
    assert other.is_error and "different values of ['amount']" in text(other)


async def test_tool_errors_read_the_same_on_replay_and_crashes_stay_private(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A ToolError's text reaches the client on the first call and on replays; any other
    exception reads as a recorded failure (its code and receipt, not its text), both
    times; the server logs its traceback once, on the call that failed, never on a replay."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("stock.reserve")
    def reserve(sku: str) -> str:
        runs.append(sku)
        raise ToolError(f"{sku} is out of stock")

    @ledger.tool("crm.sync")
    def sync_crm(account: str) -> str:
        runs.append(account)
        raise RuntimeError("password=hunter2")

    server = MCPServer("shop")
    add_tools(server, [reserve, sync_crm], workflow_id="w")
    async with Client(server) as client:
        reserved = [await client.call_tool("stock_reserve", {"sku": "A1"}) for _ in range(2)]
        synced = [await client.call_tool("crm_sync", {"account": "a"})]
        with caplog.at_level(logging.DEBUG):
            caplog.clear()
            synced.append(await client.call_tool("crm_sync", {"account": "a"}))
        replay_logs = list(caplog.records)
    assert [text(r) for r in reserved] == [
        "Error executing tool stock_reserve: A1 is out of stock"
    ] * 2
    first, again = (text(r) for r in synced)
    assert first == again
    assert first.startswith("Error executing tool crm_sync: This call failed (RuntimeError; ")
    assert "calling again with the same arguments gives this answer" in first
    assert "hunter2" not in first
    assert not [r for r in replay_logs if r.exc_info], "a replay logged a traceback"
    assert all(r.is_error for r in reserved + synced)
    assert runs == ["A1", "a"]
    assert {e.status for e in await stored(ledger)} == {EffectStatus.FAILED}


class CardDeclined(ToolError):
    code = "card_declined"  # recorded as the code, instead of the class name


async def test_a_tool_error_with_a_code_reads_the_same_on_replay(harness: StoreHarness) -> None:
    """Regression: a ToolError subclass with a class-level code was recorded under that
    code, which the replay did not recognise as a ToolError: the client read the message
    first and "Error executing tool" after. A code set on one instance only cannot be
    recognised on a replay, so that call reads as a recorded failure (its code, not its
    message) from the first answer on."""
    ledger = harness.ledger()

    @ledger.tool("pay.charge")
    async def charge(order: str) -> str:
        raise CardDeclined("the card was declined; ask for another card")

    @ledger.tool("pay.refund")
    async def refund(order: str) -> str:
        error = ToolError("refunds are closed")
        error.code = "refunds_closed"  # type: ignore[attr-defined]
        raise error

    server = MCPServer("shop")
    add_tools(server, [charge, refund], workflow_id="w")
    async with Client(server) as client:
        charged = [await client.call_tool("pay_charge", {"order": "o1"}) for _ in range(2)]
        refunded = [await client.call_tool("pay_refund", {"order": "o1"}) for _ in range(2)]
    assert [(r.is_error, text(r)) for r in charged] == [
        (True, "Error executing tool pay_charge: the card was declined; ask for another card")
    ] * 2
    assert refunded[0].is_error and text(refunded[0]) == text(refunded[1])
    assert text(refunded[0]).startswith(
        "Error executing tool pay_refund: This call failed (refunds_closed; "
    )
    assert sorted(str(e.error.code) for e in await stored(ledger) if e.error) == [
        "card_declined",
        "refunds_closed",
    ]


async def test_a_nested_ledger_error_is_the_tools_failure_first_and_on_replay(
    harness: StoreHarness,
) -> None:
    """Regression: a tool whose own tool call was denied told the client "A person denied
    this call... It did not run" (it ran, and failed), and a replay "Error executing
    tool". A nested error is the tool's exception: its recorded failure, both times. A nested
    failure that was a ToolError reads as the tool's recorded failure, both times."""
    ledger = harness.ledger()
    side_effects: list[str] = []

    @ledger.tool("db.drop", requires_approval=True)
    async def drop(table: str) -> str:
        return f"dropped {table}"

    @ledger.tool("db.cleanup")
    async def cleanup(name: str) -> str:
        side_effects.append(f"truncated {name}.log")
        return await drop(f"{name}.tmp")

    @ledger.tool("stock.check")
    async def check(sku: str) -> str:
        raise ToolError(f"{sku} is unknown")

    @ledger.tool("stock.reserve")
    async def reserve(sku: str) -> str:
        return await check(sku)

    server = MCPServer("db")
    add_tools(server, [cleanup, reserve], workflow_id="w")
    async with ledger.workflow("w"):
        with pytest.raises(ToolError):
            await check("A1")  # recorded failed: reserve's nested call replays it
        with pytest.raises(ApprovalPendingError) as pending:
            await drop.invoke({"table": "s.tmp"}, run_options=RunOptions(wait_for_approval=False))
        assert await ledger.deny(pending.value.idem_key, reason="keep it", by="ada")
    async with Client(server) as client:
        cleaned = [await client.call_tool("db_cleanup", {"name": "s"}) for _ in range(2)]
        reserved = [await client.call_tool("stock_reserve", {"sku": "A1"}) for _ in range(2)]
    assert cleaned[0].is_error and text(cleaned[0]) == text(cleaned[1])
    assert text(cleaned[0]).startswith(
        "Error executing tool db_cleanup: This call failed (EffectDeniedError; "
    )
    assert side_effects == ["truncated s.log"]
    async with ledger.workflow("w"):
        outer = await ledger.find_by_idem_key(ledger.idem_key(reserve.tool_call("A1")))
    assert outer is not None and outer.error is not None and outer.error.code == "ToolError"
    assert [(r.is_error, text(r)) for r in reserved] == [
        (True, f"Error executing tool stock_reserve: {outer.error.message}")
    ] * 2


# -- workflows ------------------------------------------------------------------------------


async def test_workflow_from_the_request_context(harness: StoreHarness) -> None:
    """workflow_id may be a function of the request's Context: calls in two workflows are
    two effects, each run once."""
    ledger = harness.ledger()
    runs: list[str] = []
    seen: list[str] = []

    def per_client(ctx: Context[Any, Any]) -> str:
        seen.append(ctx.request_id)
        return f"client-{len(seen) % 2}"

    server = shop(ledger, runs, workflow_id=per_client)
    async with Client(server) as client:
        for _ in range(4):
            await client.call_tool("payments_charge", {"order_id": "o1", "amount": 5})
    assert runs == ["o1", "o1"] and len(seen) == 4
    assert sorted(e.workflow_id for e in await stored(ledger)) == ["client-0", "client-1"]


async def test_the_server_scope_gives_the_workflow_and_none_is_a_server_error(
    harness: StoreHarness,
) -> None:
    """Without workflow_id, the ledger.workflow() the server runs in applies; with no
    workflow at all the call is a server error and nothing is stored."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs, workflow_id=None)
    async with Client(server) as client:
        lost = await client.call_tool("payments_charge", {"order_id": "o1", "amount": 5})
    assert lost.is_error and text(lost) == "Error executing tool payments_charge"
    assert await harness.raw_count() == 0
    async with ledger.workflow("served"), Client(server) as client:
        found = await client.call_tool("payments_charge", {"order_id": "o1", "amount": 5})
    assert not found.is_error and runs == ["o1"]
    (effect,) = await stored(ledger)
    assert effect.workflow_id == "served"


def test_registration_refuses_what_would_not_work(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("pinned", workflow_id="fixed")
    def pinned() -> None: ...

    server = MCPServer("s")
    with pytest.raises(EffectLedgerValidationError, match="belongs to workflow 'fixed'"):
        add_tool(server, pinned, workflow_id="other")
    with pytest.raises(EffectLedgerValidationError, match="ledger tool"):
        add_tool(server, print)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="MCPServer"):
        add_tool(object(), pinned)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="workflow_id"):
        add_tool(server, pinned, workflow_id=5)  # type: ignore[arg-type]


async def test_a_name_the_server_already_has_is_refused_before_anything_changes(
    harness: StoreHarness,
) -> None:
    """The SDK keeps a tool it already has under a name (and only logs), so registering
    the ledger tool there would leave calls bypassing the ledger: refused, naming the
    tool, and the server's tools are as they were."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = MCPServer("shop")

    @server.tool(name="payments_charge")
    async def old_charge(order_id: str) -> str:
        runs.append(f"old {order_id}")
        return "charged without a ledger"

    @ledger.tool("payments.charge")
    async def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    @ledger.tool("payments.refund")
    async def refund(order_id: str) -> str:
        return f"refunded {order_id}"

    with pytest.raises(EffectLedgerValidationError, match=r"named 'payments_charge'"):
        add_tool(server, charge, workflow_id="w")
    with pytest.raises(EffectLedgerValidationError, match=r"named 'payments_charge'"):
        add_tools(server, ledger, workflow_id="w")  # refund comes second: not added either
    with pytest.raises(EffectLedgerValidationError, match=r"'payments\.refund' is given twice"):
        add_tools(server, [refund, refund], workflow_id="w")
    assert [t.name for t in await server.list_tools()] == ["payments_charge"]
    add_tool(server, charge, name="payments.charge.v2", workflow_id="w")
    with pytest.raises(EffectLedgerValidationError, match=r"named 'payments\.charge\.v2'"):
        add_tool(server, refund, name="payments.charge.v2", workflow_id="w")
    async with Client(server) as client:
        for _ in range(2):
            result = await client.call_tool("payments.charge.v2", {"order_id": "o1"})
            assert text(result) == "charged o1"
    assert runs == ["o1"]
    assert len(await stored(ledger)) == 1


async def test_a_pinned_tool_keeps_its_workflow(harness: StoreHarness) -> None:
    """add_tools' workflow_id applies to the tools without a workflow of their own."""
    ledger = harness.ledger()

    @ledger.tool("pinned", workflow_id="fixed")
    def pinned(x: int) -> int:
        return x

    @ledger.tool("free")
    def free(x: int) -> int:
        return x

    server = MCPServer("s")
    with pytest.raises(EffectLedgerValidationError, match="ledger tool"):
        add_tools(server, [free, print])  # type: ignore[list-item]
    add_tools(server, ledger, workflow_id="given")
    async with Client(server) as client:
        assert text(await client.call_tool("pinned", {"x": 3})) == "3"
        assert text(await client.call_tool("free", {"x": 3})) == "3"
    assert sorted(e.workflow_id for e in await stored(ledger)) == ["fixed", "given"]


# -- arguments, retries and cancellations ------------------------------------------------


class Color(enum.Enum):
    RED = "red"


class Item(BaseModel):
    sku: str
    qty: int = 1


async def test_enum_date_and_model_arguments_run_with_their_json(harness: StoreHarness) -> None:
    """The SDK validates "red", "2024-01-02" and {"sku": "x"} into Color.RED, a date and an
    Item; the key and the tool get their JSON, the key a direct call with it makes."""
    ledger = harness.ledger()
    got: list[object] = []

    @ledger.tool("shop.order")
    async def order(color: Color, when: datetime.date, item: Item) -> str:
        got.append((color, when, item))
        return "ordered"

    server = MCPServer("shop")
    add_tool(server, order, workflow_id="w")
    sent = {"color": "red", "when": "2024-01-02", "item": {"sku": "x"}}
    async with Client(server) as client:
        results = [await client.call_tool("shop_order", sent) for _ in range(2)]
    assert [(r.is_error, text(r)) for r in results] == [(False, "ordered")] * 2
    assert got == [("red", "2024-01-02", {"sku": "x"})]
    (effect,) = await stored(ledger)
    async with ledger.workflow("w"):
        direct_key = ledger.idem_key(order.tool_call("red", "2024-01-02", {"sku": "x"}))
    assert effect.args == sent and effect.idem_key == direct_key


@pytest.mark.parametrize(
    ("data", "says"), [("a" * 2_000_000, "max_args_size_bytes"), (2**70, "64 bits")]
)
async def test_arguments_a_key_cannot_hold_say_what_was_wrong(
    harness: StoreHarness, data: object, says: str
) -> None:
    """A payload over the size limit or an integer beyond 64 bits: an error result saying
    what was wrong (not the opaque 'Error executing tool'), nothing stored."""
    ledger = harness.ledger()
    runs: list[object] = []

    @ledger.tool("notes.add")
    async def note(data: Any) -> str:
        runs.append(data)
        return "noted"

    server = MCPServer("notes")
    add_tool(server, note, workflow_id="w")
    async with Client(server) as client:
        result = await client.call_tool("notes_add", {"data": data})
    assert result.is_error and says in text(result)
    assert "Nothing ran and nothing was stored" in text(result)
    assert runs == []
    assert await harness.raw_count() == 0


async def test_tool_error_after_retries_reads_the_same_on_replay(harness: StoreHarness) -> None:
    """Retries ran out on a ToolError (recorded retries_exhausted): the replay reads the
    ToolError's text, as the first call did."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("seats.reserve", retry=RetryPolicy(on=ToolError, attempts=2, initial_ms=1))
    async def reserve(seat: str) -> str:
        runs.append(seat)
        raise ToolError(f"seat {seat} is taken")

    server = MCPServer("seats")
    add_tool(server, reserve, workflow_id="w")
    async with Client(server) as client:
        results = [await client.call_tool("seats_reserve", {"seat": "1A"}) for _ in range(2)]
    assert [(r.is_error, text(r)) for r in results] == [
        (True, "Error executing tool seats_reserve: seat 1A is taken")
    ] * 2
    assert runs == ["1A", "1A"]
    (effect,) = await stored(ledger)
    assert effect.error is not None and effect.error.code == "retries_exhausted"


async def test_a_call_cancelled_while_it_ran_may_have_run(harness: StoreHarness) -> None:
    """A run cancelled mid-handler, or canceled by a person after it started, may have
    happened: the model is told so, not that it did not run. A call a person canceled
    before it ran did not run."""
    ledger = harness.ledger()
    started, release = asyncio.Event(), asyncio.Event()

    @ledger.tool("mail.send")
    async def send(to: str) -> str:
        started.set()
        await release.wait()
        return f"sent to {to}"

    @ledger.tool("mail.draft", requires_approval=True)
    async def draft(to: str) -> str:
        return f"drafted for {to}"

    server = MCPServer("mail")
    add_tools(server, [send, draft], workflow_id="w")
    async with ledger.workflow("w"):
        running = asyncio.create_task(send.invoke({"to": "ada"}))
        await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        started.clear()
        held = asyncio.create_task(send.invoke({"to": "bob"}))
        await started.wait()
        assert await ledger.cancel(ledger.idem_key(send.tool_call("bob")), reason="wrong list")
        release.set()
        with pytest.raises(EffectDeniedError):
            await held
    async with Client(server) as client:
        cut = await client.call_tool("mail_send", {"to": "ada"})
        stopped = await client.call_tool("mail_send", {"to": "bob"})
        pending = await client.call_tool("mail_draft", {"to": "cy"})
        (effect,) = await ledger.pending_approvals()
        assert await ledger.cancel(effect.idem_key, reason="not needed")
        canceled = await client.call_tool("mail_draft", {"to": "cy"})
    assert pending.is_error
    assert cut.is_error and "stopped while it was running" in text(cut)
    assert stopped.is_error and "canceled this call after it had started (wrong list)" in text(
        stopped
    )
    for result in (cut, stopped):
        assert "may or may not have taken effect, and it will not run again" in text(result)
        assert "did not run" not in text(result)
    assert canceled.is_error and "canceled (not needed)" in text(canceled)
    assert "It did not run and will not run" in text(canceled)


# -- packaging ------------------------------------------------------------------------------


def test_without_mcp_the_import_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "import agent_ledger\n"
        "try:\n"
        "    import agent_ledger.adapters.mcp\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install "agent-ledger[mcp]"' in done.stdout


async def test_positional_only_parameters_and_a_parameter_named_ctx(harness: StoreHarness) -> None:
    """Every parameter kind is an argument by name; a tool's own `ctx` is not the Context."""
    ledger = harness.ledger()

    @ledger.tool("notes.tag")
    def tag(note: int, /, ctx: str = "none") -> str:
        return f"{note}:{ctx}"

    server = MCPServer("notes")
    add_tool(server, tag, workflow_id="w")
    async with Client(server) as client:
        (listed,) = (await client.list_tools()).tools
        result = await client.call_tool("notes_tag", {"note": 3, "ctx": "work"})
    assert set(listed.input_schema["properties"]) == {"note", "ctx"}
    assert text(result) == "3:work"


# -- a client that stops waiting ------------------------------------------------------------


async def test_a_retry_after_a_client_timeout_gets_the_first_calls_result(
    harness: StoreHarness,
) -> None:
    """A client that times out cancels its request (notifications/cancelled) and retries
    it. The run goes on without the request: it is not recorded canceled, and the retry
    waits for it and reads its result; the tool ran once."""
    ledger = harness.ledger()
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[str] = []
    cut_off: list[str] = []

    @ledger.tool("reports.build")
    async def build(month: str) -> str:
        runs.append(month)
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cut_off.append(month)
            raise
        return f"report {month} built"

    server = MCPServer("reports")
    add_tools(server, ledger, workflow_id="w")
    async with Client(server) as client:
        first = asyncio.create_task(
            client.call_tool("reports_build", {"month": "2025-05"}, read_timeout_seconds=0.2)
        )
        await started.wait()
        with pytest.raises(Exception, match="Timed out"):
            await first
        # Answered after the server has read the cancellation sent before it.
        await client.list_tools()
        for _ in range(20):
            await asyncio.sleep(0)
        assert cut_off == []
        (effect,) = await stored(ledger)
        assert effect.status is EffectStatus.PROCESSING
        retry = asyncio.create_task(client.call_tool("reports_build", {"month": "2025-05"}))
        await asyncio.sleep(0.05)  # the retry is waiting for the first run's outcome
        release.set()
        result = await retry
        again = await client.call_tool("reports_build", {"month": "2025-05"})
    assert [(r.is_error, text(r)) for r in (result, again)] == [(False, "report 2025-05 built")] * 2
    assert runs == ["2025-05"]
    (effect,) = await stored(ledger)
    assert effect.status is EffectStatus.SUCCEEDED


def test_a_run_still_going_when_the_server_stops_is_recorded_canceled(tmp_path: Path) -> None:
    """A run whose request was cancelled outlives the request, not the event loop: when
    the loop shuts down the run is cancelled and recorded canceled (it may have taken
    effect), which a later retry reads."""
    path = tmp_path / "ledger.db"
    code = f"""
import asyncio, logging
from mcp import Client
from mcp.server.mcpserver import MCPServer
from agent_ledger import EffectLedger, EffectLedgerOptions, SqliteStore
from agent_ledger.adapters.mcp import add_tools

logging.disable(logging.CRITICAL)
ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore({str(path)!r})))
started = asyncio.Event()

@ledger.tool("reports.build")
async def build(month: str) -> str:
    started.set()
    await asyncio.Event().wait()  # never ends on its own
    return "built"

async def main() -> None:
    server = MCPServer("reports")
    add_tools(server, ledger, workflow_id="w")
    async with Client(server) as client:
        try:
            await client.call_tool("reports_build", {{"month": "5"}}, read_timeout_seconds=0.2)
        except Exception as exc:
            print("timed out:", type(exc).__name__)
        await client.list_tools()
    (effect,) = (await ledger.list_effects()).effects
    print("after the request:", effect.status.value)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["timed out: MCPError", "after the request: processing"]

    async def read() -> Effect:
        ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(str(path))))
        (effect,) = (await ledger.list_effects()).effects
        return effect

    effect = asyncio.run(read())
    assert effect.status is EffectStatus.CANCELED
    assert effect.error is not None and effect.error.code == "cancelled"


# -- names a model API takes; budget refusals -------------------------------------------------


async def test_names_are_ones_model_apis_take_and_the_receipt_keeps_the_ledger_name(
    harness: StoreHarness,
) -> None:
    """OpenAI's rule ^[a-zA-Z0-9_-]{1,64}$: every tool is listed under such a name by
    default; the effect is recorded under the ledger's dotted name; two tools that would
    share a served name are refused before anything is registered."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    async with Client(server) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert not (
            await client.call_tool("payments_charge", {"order_id": "o1", "amount": 5})
        ).is_error
    assert names == ["payments_charge"]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in names)
    (effect,) = await stored(ledger)
    assert effect.tool == "payments.charge" and runs == ["o1"]

    @ledger.tool("payments_charge")
    def twin(order_id: str) -> str:
        return order_id

    other = MCPServer("other")
    with pytest.raises(EffectLedgerValidationError, match="would both be called 'payments_charge'"):
        add_tools(other, ledger, workflow_id="w")
    assert await other.list_tools() == []


async def test_a_budget_refusal_reads_as_one_and_runs_nothing(harness: StoreHarness) -> None:
    """Not "Error executing tool NAME": the client reads that the budget refused the call
    and nothing ran, every time it sends it."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs, workflow_id=None)
    async with ledger.workflow("capped", budget=Budget(tool_calls=1)), Client(server) as client:
        ok = await client.call_tool("payments_charge", {"order_id": "o1", "amount": 5})
        refused = [
            await client.call_tool("payments_charge", {"order_id": "o2", "amount": 5})
            for _ in range(2)
        ]
    assert not ok.is_error and runs == ["o1"]
    for result in refused:
        assert result.is_error
        assert "This call was refused before it ran: workflow 'capped' has no budget" in (
            text(result)
        )
        assert "tool_calls" in text(result)
    assert len(await stored(ledger)) == 1


class _InMemoryAgentsServer(_MCPServerWithClientSession):
    """The Agents SDK's MCP client, connected to an MCPServer in memory."""

    def __init__(self, server: MCPServer) -> None:
        super().__init__(cache_tools_list=True, client_session_timeout_seconds=None)
        self._server = server

    @property
    def name(self) -> str:
        return "in-memory"

    def create_streams(self) -> Any:
        return InMemoryTransport(self._server)


async def test_an_agents_sdk_agent_forwards_the_tools_and_runs_them_once(
    harness: StoreHarness,
) -> None:
    """An Agents SDK agent lists the MCP tools to its model under names OpenAI takes and
    calls one twice in a turn: it runs once, and the receipt has the ledger name."""
    ledger = harness.ledger()
    runs: list[str] = []
    server = shop(ledger, runs)
    args = {"order_id": "o1", "amount": 5}
    model = ScriptedModel(
        [
            [
                agents_function_call("payments_charge", args, call_id="c1"),
                agents_function_call("payments_charge", args, call_id="c2"),
            ],
            [assistant_message("done")],
        ]
    )
    set_tracing_disabled(True)
    async with _InMemoryAgentsServer(server) as forwarded:
        agent = Agent(name="shop", model=model, mcp_servers=[forwarded])
        result = await Runner.run(agent, "charge o1")
    assert result.final_output == "done" and runs == ["o1"]
    first = model.first_call
    assert first is not None
    offered = [t.name for t in first.tools]
    assert offered == ["payments_charge"]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in offered)
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(outputs) == 2 and outputs[0].output == outputs[1].output
    (effect,) = await stored(ledger)
    assert effect.tool == "payments.charge" and effect.workflow_id == "order-42"
