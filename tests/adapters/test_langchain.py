"""LangChain: ledger tools as StructuredTools, and LangChain tools run through the ledger.

Real LangChain code throughout: tools are run with ``invoke``/``ainvoke``,
given ``ToolCall`` dicts taken from an ``AIMessage``, as an agent loop does.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool, ToolException, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectDeniedError,
    EffectFailedError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
)
from agent_ledger import ToolCall as LedgerCall
from agent_ledger.adapters._common import MalformedToolCall
from agent_ledger.adapters.langchain import LedgerTool, as_langchain_tool, wrap_langchain_tool
from agent_ledger.retries import RetryPolicy
from agent_ledger.sync import open_ledger
from tests.harness import DSN, TEST_SCHEMA, StoreHarness, ensure_test_schema, require_postgres


def calls(name: str, args: dict[str, Any], n: int) -> list[ToolCall]:
    """``n`` tool calls with the same arguments and ids call_0..., as a model sends them."""
    message = AIMessage(
        "", tool_calls=[{"name": name, "args": args, "id": f"call_{i}"} for i in range(n)]
    )
    return message.tool_calls


def charge_tool(
    ledger: EffectLedger, runs: list[str], *, wait_for_approval: bool = True, **options: Any
) -> LedgerTool:
    @ledger.tool("payments.charge", idempotency_keys=["order_id"], **options)
    async def charge(
        order_id: str, amount: int, currency: str = "EUR", *, effect: Effect
    ) -> dict[str, object]:
        """Charge an order once."""
        runs.append(order_id)
        return {"order": order_id, "amount": amount, "key": effect.idem_key[:8]}

    return as_langchain_tool(charge, wait_for_approval=wait_for_approval)


def over_100(call: LedgerCall) -> bool:
    """An approval policy: amounts over 100 need a person."""
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


async def stored(ledger: EffectLedger) -> list[Effect]:
    return (await ledger.list_effects()).effects


# -- a ledger tool as a StructuredTool ----------------------------------------------------


async def test_five_tool_calls_with_five_ids_run_once(harness: StoreHarness) -> None:
    """Five ToolCalls with one set of arguments: one run, five ToolMessages, each its own id."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs)
    async with ledger.workflow("order-42"):
        replies = [
            await lc_tool.ainvoke(c)
            for c in calls(lc_tool.name, {"order_id": "o42", "amount": 5}, 5)
        ]
    assert runs == ["o42"]
    assert [r.tool_call_id for r in replies] == [f"call_{i}" for i in range(5)]
    assert all(isinstance(r, ToolMessage) and r.status == "success" for r in replies)
    assert len({r.content for r in replies}) == 1
    (effect,) = await stored(ledger)
    assert effect.call_id == "call_0"  # the first call's id; the others replayed it
    assert effect.status is EffectStatus.SUCCEEDED and effect.dedup_count == 4


async def test_concurrent_duplicate_tool_calls_run_once(harness: StoreHarness) -> None:
    """Five ToolCalls run at once (an agent's parallel tool calls): still one execution."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs)
    async with ledger.workflow("order-42"):
        replies = await asyncio.gather(
            *(lc_tool.ainvoke(c) for c in calls(lc_tool.name, {"order_id": "o1", "amount": 5}, 5))
        )
    assert runs == ["o1"]
    assert sorted(r.tool_call_id for r in replies) == [f"call_{i}" for i in range(5)]
    assert await harness.raw_count() == 1


async def test_call_id_is_never_part_of_the_key(harness: StoreHarness) -> None:
    """A ToolCall and plain arguments (no id) are one effect; a new workflow is another."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs)
    async with ledger.workflow("a"):
        (call,) = calls(lc_tool.name, {"order_id": "o1", "amount": 5}, 1)
        message = await lc_tool.ainvoke(call)
        plain = await lc_tool.ainvoke({"order_id": "o1", "amount": 5})
    async with ledger.workflow("b"):
        await lc_tool.ainvoke({"order_id": "o1", "amount": 5})
    assert json.loads(message.text) == plain
    assert runs == ["o1", "o1"]


async def test_schema_comes_from_the_signature_without_effect(harness: StoreHarness) -> None:
    """The model sees the function's parameters, types, defaults and docstring; not effect."""
    ledger = harness.ledger()
    lc_tool = charge_tool(ledger, [])
    assert (
        isinstance(lc_tool, StructuredTool)
        and lc_tool.ledger_tool is ledger.tools["payments.charge"]
    )
    assert lc_tool.name == "payments_charge"  # model providers refuse dots in names
    function = convert_to_openai_tool(lc_tool)["function"]
    assert function["name"] == "payments_charge"
    assert function["description"] == "Charge an order once."
    parameters = function["parameters"]
    assert set(parameters["properties"]) == {"order_id", "amount", "currency"}
    assert parameters["properties"]["amount"]["type"] == "integer"
    assert parameters["properties"]["currency"]["default"] == "EUR"
    assert sorted(parameters["required"]) == ["amount", "order_id"]


async def test_name_description_and_field_descriptions(harness: StoreHarness) -> None:
    """name= and description= override; Annotated Field descriptions reach the schema."""
    ledger = harness.ledger()

    @ledger.tool("mail.send")
    def send(to: Annotated[str, Field(description="who gets it")], body: str = "") -> str:
        return to

    lc_tool = as_langchain_tool(send, name="send_mail", description="Send one mail.")
    function = convert_to_openai_tool(lc_tool)["function"]
    assert (function["name"], function["description"]) == ("send_mail", "Send one mail.")
    assert function["parameters"]["properties"]["to"]["description"] == "who gets it"
    async with ledger.workflow("w"):
        assert await lc_tool.ainvoke({"to": "ada"}) == "ada"  # a sync function works too


async def test_positional_only_parameters_are_arguments_by_name(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("math.scale")
    def scale(value: int, /, factor: int = 2) -> int:
        return value * factor

    lc_tool = as_langchain_tool(scale)
    async with ledger.workflow("w"):
        assert await lc_tool.ainvoke({"value": 3}) == 6
        assert await scale(3) == 6  # the same call: one effect
    assert await harness.raw_count() == 1


@pytest.mark.parametrize(
    "args",
    [
        {"order_id": "o1"},  # missing
        {"order_id": "o1", "amount": "lots"},  # wrong type
        {"order_id": "o1", "amount": 5, "amont": 5},  # misspelt: not run with a default
        {"order_id": "o1", "amount": 5, "effect": "x"},  # the ledger's parameter
        {"order_id": "o1", "amount": float("nan")},  # no JSON for it
    ],
)
async def test_malformed_arguments_answer_the_model_and_store_nothing(
    harness: StoreHarness, args: dict[str, Any]
) -> None:
    """A ToolCall with bad arguments gets an error ToolMessage naming the problem; plain
    arguments raise MalformedToolCall; nothing is stored and nothing runs either way."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs)
    async with ledger.workflow("w"):
        (call,) = calls(lc_tool.name, args, 1)
        reply = await lc_tool.ainvoke(call)
        with pytest.raises(MalformedToolCall, match="do not fit its schema"):
            await lc_tool.ainvoke(args)
    assert isinstance(reply, ToolMessage)
    assert (reply.status, reply.tool_call_id) == ("error", "call_0")
    assert "payments_charge" in reply.text and "Nothing ran and nothing was stored" in reply.text
    assert runs == []
    assert await harness.raw_count() == 0


async def test_pending_approval_raises_and_a_denied_call_sent_again_runs_nothing(
    harness: StoreHarness,
) -> None:
    """wait_for_approval=False: ApprovalPendingError; after deny() EffectDeniedError, every time."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs, wait_for_approval=False, requires_approval=over_100)
    big = {"order_id": "o9", "amount": 500}
    first, second, third = calls(lc_tool.name, big, 3)
    async with ledger.workflow("w"):
        with pytest.raises(ApprovalPendingError) as pending:
            await lc_tool.ainvoke(first)
        assert await ledger.deny(pending.value.idem_key, reason="too much", by="ops")
        for again in (second, third):
            with pytest.raises(EffectDeniedError, match="too much"):
                await lc_tool.ainvoke(again)
    assert runs == []
    (effect,) = await stored(ledger)
    assert effect.status is EffectStatus.DENIED and effect.call_id == "call_0"


async def test_approved_call_runs_once_when_sent_again(harness: StoreHarness) -> None:
    """After approve(), the same call (any id) runs once; later ones replay."""
    ledger = harness.ledger()
    runs: list[str] = []
    lc_tool = charge_tool(ledger, runs, wait_for_approval=False, requires_approval=True)
    first, second, third = calls(lc_tool.name, {"order_id": "o7", "amount": 5}, 3)
    async with ledger.workflow("w"):
        with pytest.raises(ApprovalPendingError) as pending:
            await lc_tool.ainvoke(first)
        assert runs == []
        assert await ledger.approve(pending.value.idem_key, by="ops")
        replies = [await lc_tool.ainvoke(c) for c in (second, third)]
    assert runs == ["o7"]
    assert [r.tool_call_id for r in replies] == ["call_1", "call_2"]


async def test_by_default_a_call_waits_for_the_approval(harness: StoreHarness) -> None:
    """wait_for_approval=True (the default) waits for the person, like the tool itself."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("deploy", requires_approval=True)
    async def deploy(service: str) -> str:
        runs.append(service)
        return f"deployed {service}"

    lc_tool = as_langchain_tool(deploy)
    (call,) = calls(lc_tool.name, {"service": "api"}, 1)
    async with ledger.workflow("w"):
        waiting = asyncio.create_task(lc_tool.ainvoke(call))
        while not await ledger.pending_approvals():
            await asyncio.sleep(0.01)
        assert not waiting.done() and runs == []
        (effect,) = await ledger.pending_approvals()
        assert await ledger.approve(effect.idem_key)
        reply = await asyncio.wait_for(waiting, 10)
    assert reply.content == "deployed api" and runs == ["api"]


async def test_a_tool_exception_is_a_retryable_failure_a_later_call_runs_again(
    harness: StoreHarness,
) -> None:
    """LangChain's ToolException is its retry signal: recorded as a retryable failure, shown
    to the model (handle_tool_error) saying a call again runs again, and the next call
    with the same arguments does run again; the earlier failure stays in the history."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("stock.reserve")
    async def reserve(sku: str) -> str:
        runs.append(sku)
        if len(runs) < 3:
            raise ToolException(f"{sku} is out of stock")
        return f"reserved {sku}"

    lc_tool = as_langchain_tool(reserve)
    lc_tool.handle_tool_error = True
    async with ledger.workflow("w"):
        replies = [await lc_tool.ainvoke(c) for c in calls(lc_tool.name, {"sku": "A1"}, 2)]
        lc_tool.handle_tool_error = False
        assert await lc_tool.ainvoke({"sku": "A1"}) == "reserved A1"
        assert await lc_tool.ainvoke({"sku": "A1"}) == "reserved A1"  # now a receipt
    assert [r.status for r in replies] == ["error", "error"]
    assert all("A1 is out of stock" in r.text and "runs it again" in r.text for r in replies)
    assert runs == ["A1"] * 3
    (effect,) = await stored(ledger)
    assert effect.status is EffectStatus.SUCCEEDED and effect.attempt == 3


class CardDeclined(ToolException):
    code = "card_declined"  # recorded as the code, instead of the class name


async def test_a_tool_exception_subclass_or_with_a_code_is_retryable_too(
    harness: StoreHarness,
) -> None:
    """Whatever its class or code, a ToolException is retryable, sync and async alike,
    and raised (without handle_tool_error) as a ToolException saying so."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("pay.charge")
    async def charge(order: str) -> str:
        runs.append(order)
        raise CardDeclined("the card was declined; ask for another card")

    @ledger.tool("pay.refund")
    def refund(order: str) -> str:
        runs.append(order)
        error = ToolException("refunds are closed")
        error.code = "refunds_closed"  # type: ignore[attr-defined]
        raise error

    charge_lc, refund_lc = as_langchain_tool(charge), as_langchain_tool(refund)
    charge_lc.handle_tool_error = True
    async with ledger.workflow("w"):
        charged = [await charge_lc.ainvoke(c) for c in calls(charge_lc.name, {"order": "o"}, 2)]
        for _ in range(2):
            with pytest.raises(ToolException, match=r"may be retried.*refunds are closed"):
                await asyncio.to_thread(refund_lc.invoke, {"order": "r"})
    assert all("ask for another card" in r.text and r.status == "error" for r in charged)
    assert runs == ["o", "o", "r", "r"]


async def test_other_exceptions_reach_the_application(harness: StoreHarness) -> None:
    """The tool's own exception is raised as is; a replay raises EffectFailedError."""
    ledger = harness.ledger()

    @ledger.tool("crm.sync")
    async def sync_crm(account: str) -> None:
        raise ValueError(f"no account {account}")

    lc_tool = as_langchain_tool(sync_crm)
    first, second = calls(lc_tool.name, {"account": "a1"}, 2)
    async with ledger.workflow("w"):
        with pytest.raises(ValueError, match="no account a1"):
            await lc_tool.ainvoke(first)
        with pytest.raises(EffectFailedError, match="no account a1"):
            await lc_tool.ainvoke(second)


async def test_a_call_outside_a_workflow_raises(harness: StoreHarness) -> None:
    """No workflow is the application's mistake, not the model's: it raises, storing nothing."""
    ledger = harness.ledger()
    lc_tool = charge_tool(ledger, [])
    (call,) = calls(lc_tool.name, {"order_id": "o1", "amount": 5}, 1)
    with pytest.raises(EffectLedgerValidationError, match="outside a workflow"):
        await lc_tool.ainvoke(call)
    assert await harness.raw_count() == 0


def test_only_ledger_tools_convert() -> None:
    with pytest.raises(EffectLedgerValidationError, match="ledger tool"):
        as_langchain_tool(len)  # type: ignore[arg-type]


# -- sync invoke ------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def sync_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EffectLedger]:
    """A ledger for sync code (agent_ledger.sync), on each store; closed afterwards."""
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        require_postgres()
        asyncio.run(ensure_test_schema())
        url = f"{DSN}?schema={TEST_SCHEMA}"
    ledger = open_ledger(url)
    try:
        yield ledger
    finally:
        ledger.close_sync()


def effects_in(ledger: EffectLedger, workflow: str) -> list[Effect]:
    return ledger.call_sync(ledger.list_effects, workflow_id=workflow).effects


def test_sync_invoke_runs_once_for_five_tool_calls(sync_ledger: EffectLedger) -> None:
    """invoke() from sync code: five ToolCalls, one run, five messages with their own ids."""
    runs: list[str] = []
    lc_tool = charge_tool(sync_ledger, runs)
    workflow = f"sync-{uuid.uuid4()}"
    with sync_ledger.workflow(workflow):
        replies = [
            lc_tool.invoke(c) for c in calls(lc_tool.name, {"order_id": "o", "amount": 1}, 5)
        ]
    assert runs == ["o"]
    assert [r.tool_call_id for r in replies] == [f"call_{i}" for i in range(5)]
    (effect,) = effects_in(sync_ledger, workflow)
    assert effect.call_id == "call_0"


def test_sync_invoke_answers_malformed_calls_and_keeps_denials(sync_ledger: EffectLedger) -> None:
    """Sync: a malformed call stores nothing; pending raises; denied stays denied; approved
    runs once."""
    runs: list[str] = []
    lc_tool = charge_tool(sync_ledger, runs, wait_for_approval=False, requires_approval=over_100)
    workflow = f"sync-{uuid.uuid4()}"
    with sync_ledger.workflow(workflow):
        (bad,) = calls(lc_tool.name, {"order_id": "o"}, 1)
        assert lc_tool.invoke(bad).status == "error"
        assert effects_in(sync_ledger, workflow) == []
        for order, decide in (("denied", sync_ledger.deny), ("approved", sync_ledger.approve)):
            with pytest.raises(ApprovalPendingError) as pending:
                lc_tool.invoke({"order_id": order, "amount": 500})
            assert sync_ledger.call_sync(decide, pending.value.idem_key)
        with pytest.raises(EffectDeniedError):
            lc_tool.invoke({"order_id": "denied", "amount": 500})
        for call in calls(lc_tool.name, {"order_id": "approved", "amount": 500}, 2):
            assert lc_tool.invoke(call).status == "success"
    assert runs == ["approved"]


def test_sync_invoke_of_a_wrapped_tool(sync_ledger: EffectLedger) -> None:
    """A wrapped LangChain tool invoked from sync code runs once per key too."""
    SEARCHES.clear()
    wrapped = wrap_langchain_tool(sync_ledger, search)
    workflow = f"sync-{uuid.uuid4()}"
    with sync_ledger.workflow(workflow):
        replies = [wrapped.invoke(c) for c in calls("search", {"query": "desk"}, 3)]
    assert SEARCHES == ["desk"]
    assert [r.content for r in replies] == [["desk-0", "desk-1"]] * 3


# -- a LangChain tool run through the ledger ----------------------------------------------


@tool
def search(query: str, limit: int = 2) -> list[str]:
    """Search the catalogue."""
    SEARCHES.append(query)
    return [f"{query}-{i}" for i in range(limit)]


SEARCHES: list[str] = []


async def test_wrapped_tool_runs_once_per_key_and_is_registered(harness: StoreHarness) -> None:
    """wrap_langchain_tool: registered in ledger.tools; duplicates replay; same name and schema."""
    ledger = harness.ledger()
    SEARCHES.clear()
    wrapped = wrap_langchain_tool(ledger, search, "catalogue.search")
    assert ledger.tools["catalogue.search"] is wrapped.ledger_tool
    assert convert_to_openai_tool(wrapped) == convert_to_openai_tool(search)
    async with ledger.workflow("w"):
        replies = [await wrapped.ainvoke(c) for c in calls("search", {"query": "lamp"}, 5)]
        await wrapped.ainvoke({"query": "lamp", "limit": 2})  # the default, spelt out: same key
    assert SEARCHES == ["lamp"]
    assert [r.tool_call_id for r in replies] == [f"call_{i}" for i in range(5)]
    assert all(r.content == ["lamp-0", "lamp-1"] for r in replies)
    (effect,) = await stored(ledger)
    assert effect.tool == "catalogue.search" and effect.call_id == "call_0"
    assert effect.args == {"query": "lamp", "limit": 2}


async def test_wrapped_tool_keys_approval_and_denial(harness: StoreHarness) -> None:
    """Keys and approval policy as @ledger.tool takes them; a denied call never runs."""
    ledger = harness.ledger()
    sent: list[str] = []

    class Refund(BaseModel):
        order_id: str
        amount: int
        note: str = ""

    def refund(order_id: str, amount: int, note: str = "") -> str:
        sent.append(order_id)
        return f"refunded {amount} on {order_id}"

    base = StructuredTool.from_function(refund, args_schema=Refund, description="Refund an order.")
    wrapped = wrap_langchain_tool(
        ledger,
        base,
        idempotency_keys=["order_id"],
        validate_keys=["amount"],
        requires_approval=over_100,
        wait_for_approval=False,
    )
    async with ledger.workflow("w"):
        first, second = calls("refund", {"order_id": "o1", "amount": 10, "note": "a"}, 2)
        assert (await wrapped.ainvoke(first)).text == "refunded 10 on o1"
        assert (await wrapped.ainvoke(second)).text == "refunded 10 on o1"  # note differs: replay
        with pytest.raises(ApprovalPendingError) as pending:
            await wrapped.ainvoke({"order_id": "o2", "amount": 500})
        assert await ledger.deny(pending.value.idem_key)
        with pytest.raises(EffectDeniedError):
            await wrapped.ainvoke({"order_id": "o2", "amount": 500})
        (bad,) = calls("refund", {"order_id": "o3"}, 1)
        reply = await wrapped.ainvoke(bad)
    assert sent == ["o1"]
    assert reply.status == "error" and "amount" in reply.text
    assert await harness.raw_count() == 2  # o1 and the denied o2; the malformed call stored nothing


async def test_wrapped_json_schema_tool_checks_arguments_before_storing(
    harness: StoreHarness,
) -> None:
    """A tool described by a JSON schema is not validated by LangChain: the ledger's binding
    answers a bad call, before anything is stored."""
    ledger = harness.ledger()

    class Echo(BaseTool):
        name: str = "echo"
        description: str = "Echo a word."

        def _run(self, word: str, times: int = 1, suffix: str = "!") -> str:
            return word * times + suffix

    schema = {
        "type": "object",
        "properties": {
            "word": {"type": "string"},
            "times": {"type": "integer", "default": 1},
            "suffix": {"type": "string"},  # optional, its default left to the tool
        },
        "required": ["word"],
    }
    wrapped = wrap_langchain_tool(ledger, Echo(args_schema=schema))
    async with ledger.workflow("w"):
        good, bad = calls("echo", {"word": "hi"}, 1)[0], calls("echo", {"wurd": "hi"}, 1)[0]
        assert (await wrapped.ainvoke(good)).text == "hi!"
        assert await wrapped.ainvoke({"word": "hi", "times": 2, "suffix": "?"}) == "hihi?"
        reply = await wrapped.ainvoke(bad)
        with pytest.raises(MalformedToolCall, match="wurd"):
            await wrapped.ainvoke({"wurd": "hi"})
    assert reply.status == "error" and "wurd" in reply.text
    assert await harness.raw_count() == 2


def test_wrapping_refuses_what_cannot_be_a_key(harness: StoreHarness) -> None:
    """Artifacts, injected arguments and a name already taken are refused, clearly."""
    ledger = harness.ledger()

    @tool(response_format="content_and_artifact")
    def fetch(url: str) -> tuple[str, dict[str, Any]]:
        """Fetch a page."""
        return "page", {"raw": url}

    @tool
    def remember(fact: str, memory: Annotated[dict[str, Any], InjectedToolArg]) -> str:
        """Remember a fact."""
        return fact

    with pytest.raises(EffectLedgerValidationError, match="content_and_artifact"):
        wrap_langchain_tool(ledger, fetch)
    with pytest.raises(EffectLedgerValidationError, match="injected"):
        wrap_langchain_tool(ledger, remember)
    wrap_langchain_tool(ledger, search)
    with pytest.raises(EffectLedgerValidationError, match="already registered"):
        wrap_langchain_tool(ledger, search)
    with pytest.raises(EffectLedgerValidationError, match="BaseTool"):
        wrap_langchain_tool(ledger, len)  # type: ignore[arg-type]


# -- arguments LangChain validated into Python objects ----------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(BaseModel):
    sku: str
    qty: int = 1


async def test_enum_date_and_model_arguments_run_with_their_json(harness: StoreHarness) -> None:
    """LangChain validates "red", "2024-01-02" and {"sku": "x"} into Color.RED, a date and
    an Item; the key and the tool get their JSON (an unsent default left out), so the key
    is the one a direct call (or the OpenAI adapter) with the same JSON makes."""
    ledger = harness.ledger()
    got: list[object] = []

    @ledger.tool("shop.order")
    async def order(color: Color, when: datetime.date, item: Item) -> str:
        got.append((color, when, item))
        return "ordered"

    lc_tool = as_langchain_tool(order)
    sent = {"color": "red", "when": "2024-01-02", "item": {"sku": "x"}}
    async with ledger.workflow("w"):
        replies = [await lc_tool.ainvoke(c) for c in calls(lc_tool.name, sent, 2)]
        assert await order("red", "2024-01-02", {"sku": "x"}) == "ordered"  # the same effect
        direct_key = ledger.idem_key(order.tool_call("red", "2024-01-02", {"sku": "x"}))
    assert [(r.status, r.text) for r in replies] == [("success", "ordered")] * 2
    assert got == [("red", "2024-01-02", {"sku": "x"})]
    (effect,) = await stored(ledger)
    assert effect.args == sent and effect.idem_key == direct_key


async def test_wrapped_tool_with_enum_and_model_arguments_runs_once(
    harness: StoreHarness,
) -> None:
    """A wrapped LangChain tool whose arguments are an enum and a model: stored as JSON,
    validated again by the tool itself, run once per key."""
    ledger = harness.ledger()
    got: list[object] = []

    def paint(color: Color, item: Item) -> str:
        got.append((color, item))
        return f"{item.sku} painted {color.value}"

    base = StructuredTool.from_function(paint, description="Paint an item.")
    wrapped = wrap_langchain_tool(ledger, base)
    async with ledger.workflow("w"):
        sent = {"color": "blue", "item": {"sku": "x"}}
        replies = [await wrapped.ainvoke(c) for c in calls("paint", sent, 3)]
    assert [r.text for r in replies] == ["x painted blue"] * 3
    assert got == [(Color.BLUE, Item(sku="x"))]
    (effect,) = await stored(ledger)
    assert effect.args == sent


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"x": float("nan")}, "NaN"),  # inside a dict: the schema's float check misses it
        ("a" * 2_000_000, "max_args_size_bytes"),
        (2**70, "64 bits"),
    ],
)
async def test_arguments_a_key_cannot_hold_answer_the_model(
    harness: StoreHarness, data: object, says: str
) -> None:
    """Values the schema lets through but a key cannot hold: an error ToolMessage (plain
    arguments: MalformedToolCall), nothing stored, nothing run."""
    ledger = harness.ledger()
    runs: list[object] = []

    @ledger.tool("notes.add")
    async def note(data: Any) -> str:
        runs.append(data)
        return "noted"

    lc_tool = as_langchain_tool(note)
    async with ledger.workflow("w"):
        (call,) = calls(lc_tool.name, {"data": data}, 1)
        reply = await lc_tool.ainvoke(call)
        with pytest.raises(MalformedToolCall, match="cannot be recorded"):
            await lc_tool.ainvoke({"data": data})
        sync_reply = await asyncio.to_thread(lc_tool.invoke, call)
    for answer in (reply, sync_reply):
        assert isinstance(answer, ToolMessage) and answer.status == "error"
        assert says in answer.text and "Nothing ran and nothing was stored" in answer.text
    assert runs == []
    assert await harness.raw_count() == 0


def test_wrapping_refuses_a_default_factory(harness: StoreHarness) -> None:
    """A field with a default_factory gets a new value on every run before the key is
    made, so every repeat would run again: refused, naming the field."""
    ledger = harness.ledger()

    class ChargeArgs(BaseModel):
        order_id: str
        token: str = Field(default_factory=lambda: uuid.uuid4().hex)

    def charge(order_id: str, token: str) -> str:
        return order_id

    base = StructuredTool.from_function(charge, args_schema=ChargeArgs, description="Charge.")
    with pytest.raises(EffectLedgerValidationError, match=r"default_factory \(\['token'\]\)"):
        wrap_langchain_tool(ledger, base)
    assert "charge" not in ledger.tools


async def test_tool_exception_after_retries_reads_the_same_on_replay(
    harness: StoreHarness,
) -> None:
    """A tool whose retries ran out on a ToolException is recorded retries_exhausted; a
    replay still raises the ToolException with the first call's text."""
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool(
        "stock.hold", retry=RetryPolicy(on=ToolException, attempts=2, initial_ms=1, jitter=0)
    )
    async def hold(sku: str) -> str:
        runs.append(sku)
        raise ToolException(f"{sku} is out of stock")

    lc_tool = as_langchain_tool(hold)
    lc_tool.handle_tool_error = True
    async with ledger.workflow("w"):
        replies = [await lc_tool.ainvoke(c) for c in calls(lc_tool.name, {"sku": "A1"}, 2)]
        lc_tool.handle_tool_error = False
        with pytest.raises(ToolException, match=r"^A1 is out of stock$"):
            await lc_tool.ainvoke({"sku": "A1"})
    assert [(r.status, r.text) for r in replies] == [("error", "A1 is out of stock")] * 2
    assert runs == ["A1", "A1"]
    (effect,) = await stored(ledger)
    assert effect.error is not None and effect.error.code == "retries_exhausted"


# -- packaging ------------------------------------------------------------------------------


def test_without_langchain_the_import_error_names_the_extra() -> None:
    """With langchain-core missing, importing the adapter says which extra to install."""
    code = (
        "import sys; sys.modules['langchain_core'] = None\n"
        "import agent_ledger\n"
        "try:\n"
        "    import agent_ledger.adapters.langchain\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install "agent-ledger[langchain]"' in done.stdout
