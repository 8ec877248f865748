"""The OpenAI adapter: Chat Completions tool calls and Responses function calls, on every store.

The model's calls are the SDK's own objects (and their dicts), built here
as the API would have returned them; no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Annotated, Any, Literal

import orjson
import pydantic
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageCustomToolCall,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionToolMessageParam,
)
from openai.types.chat.chat_completion_message_custom_tool_call import Custom
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import (
    FunctionToolParam,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectDeniedError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    MemoryStore,
    RunOptions,
)
from agent_ledger.adapters.openai import (
    chat_tools,
    responses_tools,
    run_function_calls,
    run_tool_calls,
)
from agent_ledger.retries import RetryPolicy
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool
from tests.harness import StoreHarness

NO_WAIT = RunOptions(wait_for_approval=False)


def chat_call(call_id: str, name: str, arguments: str) -> ChatCompletionMessageFunctionToolCall:
    """A tool call as ``message.tool_calls`` holds it."""
    return ChatCompletionMessageFunctionToolCall(
        id=call_id, type="function", function=Function(name=name, arguments=arguments)
    )


def function_call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    """A function call as ``response.output`` holds it."""
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}",
        call_id=call_id,
        name=name,
        arguments=arguments,
        type="function_call",
        status="completed",
    )


def charge_tool(ledger: EffectLedger, runs: list[str], **options: Any) -> Tool[dict[str, object]]:
    """``payments.charge``, keyed on the order, recording each real run in ``runs``."""

    @ledger.tool("payments.charge", idempotency_keys=["order_id"], **options)
    async def charge(order_id: str, amount: int, *, effect: Effect) -> dict[str, object]:
        """Charge an order's card."""
        runs.append(order_id)
        return {"order": order_id, "amount": amount, "charge": effect.idem_key[:8]}

    return charge


async def stored(ledger: EffectLedger, tool: Tool[Any], *args: object) -> Effect:
    effect = await ledger.find_by_idem_key(ledger.idem_key(tool.tool_call(*args)))
    assert effect is not None
    return effect


# --- Chat Completions: one execution per key, every call answered -----------------------


async def test_five_duplicate_calls_in_one_message_run_once(harness: StoreHarness) -> None:
    """Five calls with one key and five ids: one run, five answers each with its own id."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge = charge_tool(ledger, runs)
    calls = [
        chat_call(f"call_{i}", "payments_charge", '{"order_id":"o1","amount":5}') for i in range(5)
    ]
    async with ledger.workflow("conv-1"):
        messages = await run_tool_calls(ledger, calls)
        effect = await stored(ledger, charge, "o1", 5)
    assert runs == ["o1"]
    assert [m["tool_call_id"] for m in messages] == [f"call_{i}" for i in range(5)]
    assert all(m["role"] == "tool" for m in messages)
    assert len({orjson.dumps(m["content"]) for m in messages}) == 1
    assert orjson.loads(str(messages[0]["content"]))["order"] == "o1"
    # The id is recorded, not keyed: the effect is the one a direct call makes.
    assert effect.call_id in {f"call_{i}" for i in range(5)}
    assert effect.dedup_count == 4
    assert await harness.raw_count() == 1
    # What comes back is what the SDK's message parameter type describes.
    adapter = pydantic.TypeAdapter(list[ChatCompletionToolMessageParam])
    assert adapter.validate_python(messages) == messages


async def test_a_call_repeated_over_five_turns_runs_once(harness: StoreHarness) -> None:
    """The model repeats the call under a new id each turn: the first id is the receipt's."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge = charge_tool(ledger, runs)
    answers = []
    async with ledger.workflow("conv-1"):
        for i in range(5):
            # Argument order and spacing differ; the bound arguments do not.
            arguments = (
                '{"amount": 5, "order_id": "o1"}' if i % 2 else '{"order_id":"o1","amount":5}'
            )
            (message,) = await run_tool_calls(
                ledger, [chat_call(f"call_{i}", "payments_charge", arguments)]
            )
            answers.append(message)
        effect = await stored(ledger, charge, "o1", 5)
        assert await charge("o1", 5) == orjson.loads(str(answers[0]["content"]))
    assert runs == ["o1"]
    assert [a["tool_call_id"] for a in answers] == [f"call_{i}" for i in range(5)]
    assert len({str(a["content"]) for a in answers}) == 1
    assert effect.call_id == "call_0"


async def test_sdk_objects_and_their_dicts_are_the_same_calls(harness: StoreHarness) -> None:
    """message.tool_calls from a parsed ChatCompletion, its model_dump() and hand-made dicts."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs)
    completion = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_a",
                                "type": "function",
                                "function": {
                                    "name": "payments_charge",
                                    "arguments": '{"order_id":"o7","amount":70}',
                                },
                            }
                        ],
                    },
                }
            ],
        }
    )
    tool_calls = completion.choices[0].message.tool_calls
    assert tool_calls is not None
    as_dicts = [c.model_dump() for c in tool_calls]
    hand_made = {
        "id": "call_c",
        "function": {"name": "payments_charge", "arguments": '{"order_id":"o7","amount":70}'},
    }
    async with ledger.workflow("conv-1"):
        first = await run_tool_calls(ledger, tool_calls)
        second = await run_tool_calls(ledger, [{**as_dicts[0], "id": "call_b"}])
        third = await run_tool_calls(ledger, [hand_made])
    assert runs == ["o7"]
    assert [m["tool_call_id"] for m in first + second + third] == ["call_a", "call_b", "call_c"]
    assert first[0]["content"] == second[0]["content"] == third[0]["content"]


async def test_no_tool_calls_and_custom_tool_calls_give_nothing(harness: StoreHarness) -> None:
    """message.tool_calls is None without calls; custom (free-text) tools are the app's."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs)
    custom = ChatCompletionMessageCustomToolCall(
        id="call_x", type="custom", custom=Custom(name="payments_charge", input="o1 5")
    )
    async with ledger.workflow("conv-1"):
        assert await run_tool_calls(ledger, None) == []
        assert await run_tool_calls(ledger, []) == []
        assert await run_tool_calls(ledger, [custom]) == []
    assert runs == [] and await harness.raw_count() == 0


# --- malformed calls: an answer for the model, nothing stored ---------------------------

MALFORMED = {
    "json that does not parse": (
        "payments_charge",
        '{"order_id": "o1", "amount": ',
        "not valid JSON",
    ),
    "json that is not an object": ("payments_charge", '["o1", 5]', "must be a JSON object"),
    "an unknown tool": ("payments_refund", '{"order_id": "o1"}', "no tool named 'payments_refund'"),
    "a missing argument": ("payments_charge", '{"order_id": "o1"}', "missing required arguments"),
    "an unexpected argument": (
        "payments_charge",
        '{"order_id": "o1", "amount": 5, "tip": 1}',
        "unexpected keyword argument 'tip'",
    ),
    "the effect as an argument": (
        "payments_charge",
        '{"order_id": "o1", "amount": 5, "effect": "x"}',
        "got effect=..., which the ledger passes itself",
    ),
}


@pytest.mark.parametrize(("name", "arguments", "says"), MALFORMED.values(), ids=list(MALFORMED))
async def test_malformed_call_is_answered_and_stores_nothing(
    harness: StoreHarness, name: str, arguments: str, says: str
) -> None:
    """The model reads what was wrong, under its call's id; the store stays empty."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs)
    async with ledger.workflow("conv-1"):
        (chat,) = await run_tool_calls(ledger, [chat_call("call_1", name, arguments)])
        (output,) = await run_function_calls(ledger, [function_call("call_2", name, arguments)])
    assert chat["tool_call_id"] == "call_1" and output["call_id"] == "call_2"
    for text in (chat["content"], output["output"]):
        assert isinstance(text, str) and text.startswith("Error: ") and says in text
    assert runs == []
    assert await harness.raw_count() == 0


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


#: Arguments that parse and bind, but that the ledger cannot keep as sent.
UNSTORABLE = {
    "over max_args_size_bytes": (orjson.dumps({"note": "a" * 1_100_000}).decode(), "over max_args"),
    "nested too deep": (orjson.dumps({"note": nested(200)}).decode(), "args['note'][0]"),
    "an integer beyond 64 bits": ('{"note": 18446744073709551616}', "beyond 64 bits"),
    "a negative one": ('{"note": -9223372036854775809}', "beyond 64 bits"),
    "NaN": ('{"note": NaN}', "NaN, which is not JSON"),
    "Infinity": ('{"note": [-Infinity]}', "-Infinity, which is not JSON"),
    "a lone surrogate": ('{"note": "\\ud800"}', "args"),
    "a lone surrogate in a nested key": ('{"note": {"\\udc00": 1}}', "args"),
}


@pytest.mark.parametrize(("arguments", "says"), UNSTORABLE.values(), ids=list(UNSTORABLE))
async def test_arguments_the_ledger_cannot_keep_are_answered_not_raised(
    harness: StoreHarness, arguments: str, says: str
) -> None:
    """Regression: these raised EffectLedgerValidationError out of run_tool_calls.

    The model sent them, so the model reads what was wrong; nothing runs or
    is stored, and the turn's other calls are answered as usual.
    """
    ledger = harness.ledger()
    runs: list[object] = []

    @ledger.tool("notes.add")
    async def add(note: object) -> str:
        runs.append(note)
        return "added"

    async with ledger.workflow("conv-1"):
        chat = await run_tool_calls(
            ledger,
            [chat_call("c1", "notes_add", arguments), chat_call("c2", "notes_add", '{"note": 1}')],
        )
        (output,) = await run_function_calls(ledger, [function_call("c3", "notes_add", arguments)])
    for text in (chat[0]["content"], output["output"]):
        assert isinstance(text, str) and text.startswith(
            "Error: the arguments for tool 'notes_add' "
        )
        assert says in text
    assert chat[1]["content"] == "added"
    assert runs == [1]
    assert await harness.raw_count() == 1


async def test_integers_beyond_64_bits_are_refused_not_merged(harness: StoreHarness) -> None:
    """Regression: 2**64 and 2**64 + 1 both became 1.8446744073709552e19, one key: the
    second transfer replayed the first. Now each is answered with an error, nothing stored;
    the largest integers a key holds run as sent."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("bank.transfer")
    async def transfer(account: int, amount: int) -> str:
        runs.append(account)
        return f"sent {amount} to {account}"

    async with ledger.workflow("w1"):
        refused = await run_tool_calls(
            ledger,
            [
                chat_call("c1", "bank_transfer", '{"account": 18446744073709551616, "amount": 5}'),
                chat_call("c2", "bank_transfer", '{"account": 18446744073709551617, "amount": 5}'),
            ],
        )
        assert await harness.raw_count() == 0
        ran = await run_tool_calls(
            ledger,
            [
                chat_call("c3", "bank_transfer", '{"account": 18446744073709551615, "amount": 5}'),
                chat_call("c4", "bank_transfer", '{"account": 18446744073709551614, "amount": 5}'),
            ],
        )
    for message, account in zip(
        refused, ("18446744073709551616", "18446744073709551617"), strict=True
    ):
        assert str(message["content"]).startswith("Error: ")
        assert f"the integer {account}, beyond 64 bits" in str(message["content"])
    assert [m["content"] for m in ran] == [
        "sent 5 to 18446744073709551615",
        "sent 5 to 18446744073709551614",
    ]
    # The calls of one batch run concurrently: either may start first.
    assert sorted(runs) == [2**64 - 2, 2**64 - 1]
    assert await harness.raw_count() == 2


async def test_unknown_tool_answer_lists_the_names_the_model_knows(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    charge_tool(ledger, [])
    async with ledger.workflow("conv-1"):
        (message,) = await run_tool_calls(ledger, [chat_call("c", "refund", "{}")])
    assert str(message["content"]).endswith("the tools are: payments_charge")


async def test_a_call_without_an_id_is_refused_before_anything_runs(harness: StoreHarness) -> None:
    """A broken item is the application's (the API always sends ids): raised, nothing runs."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs)
    good = chat_call("call_1", "payments_charge", '{"order_id":"o1","amount":5}')
    broken = {"type": "function", "function": {"name": "payments_charge", "arguments": "{}"}}
    async with ledger.workflow("conv-1"):
        with pytest.raises(EffectLedgerValidationError, match="'id'"):
            await run_tool_calls(ledger, [good, broken])
        with pytest.raises(EffectLedgerValidationError, match="'call_id'"):
            await run_function_calls(ledger, [{"type": "function_call", "name": "payments_charge"}])
        with pytest.raises(EffectLedgerValidationError, match="string name"):
            await run_tool_calls(ledger, [{"id": "call_2", "type": "function"}])
    assert runs == [] and await harness.raw_count() == 0


async def test_a_call_outside_a_workflow_is_raised_not_answered(harness: StoreHarness) -> None:
    """No workflow is the application's mistake: the model cannot fix it."""
    ledger = harness.ledger()
    charge_tool(ledger, [])
    with pytest.raises(EffectLedgerValidationError, match="outside a workflow"):
        await run_tool_calls(
            ledger, [chat_call("c", "payments_charge", '{"order_id":"o","amount":1}')]
        )
    assert await harness.raw_count() == 0


# --- approvals and denials ----------------------------------------------------------------


async def test_pending_approval_raises_then_runs_once_after_approve(harness: StoreHarness) -> None:
    """wait_for_approval=False: raised while pending; after approve() the same call runs once."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge = charge_tool(ledger, runs, requires_approval=True)
    call = chat_call("call_1", "payments_charge", '{"order_id":"o1","amount":5}')
    async with ledger.workflow("conv-1"):
        for _ in range(2):
            with pytest.raises(ApprovalPendingError) as pending:
                await run_tool_calls(ledger, [call], wait_for_approval=False)
        with pytest.raises(ApprovalPendingError):
            # The same thing spelled as run options; the model's repeat under a new id too.
            await run_tool_calls(
                ledger,
                [chat_call("call_2", "payments_charge", '{"order_id":"o1","amount":5}')],
                run_options=NO_WAIT,
            )
        assert runs == []
        effect = await stored(ledger, charge, "o1", 5)
        assert effect.status is EffectStatus.REQUIRES_APPROVAL and effect.call_id == "call_1"
        assert pending.value.idem_key == effect.idem_key

        assert await ledger.approve(pending.value.idem_key, by="ops")
        (first,) = await run_tool_calls(ledger, [call], wait_for_approval=False)
        (again,) = await run_tool_calls(ledger, [call], wait_for_approval=False)
    assert runs == ["o1"]
    assert first == again and first["tool_call_id"] == "call_1"


async def test_a_denied_call_is_answered_as_its_result_and_never_runs(
    harness: StoreHarness,
) -> None:
    """After deny(), the call (any id, waiting or not, both APIs) is answered with who said no
    and why, as that call's result; nothing runs and the turn's other calls are answered."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs, requires_approval=lambda call: call.args["order_id"] == "o1")
    arguments = '{"order_id":"o1","amount":5}'
    other = chat_call("call_ok", "payments_charge", '{"order_id":"o2","amount":5}')
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_calls(
                ledger, [chat_call("call_1", "payments_charge", arguments)], wait_for_approval=False
            )
        assert await ledger.deny(pending.value.idem_key, reason="too much", by="ops")
        for call_id, wait in (("call_1", False), ("call_2", None), ("call_3", True)):
            denied, ok = await asyncio.wait_for(
                run_tool_calls(
                    ledger,
                    [chat_call(call_id, "payments_charge", arguments), other],
                    wait_for_approval=wait,
                ),
                10,
            )
            assert denied["tool_call_id"] == call_id
            assert str(denied["content"]).startswith("Error: A person denied this call (too much)")
            assert "did not run and will not run" in denied["content"]
            assert ok["tool_call_id"] == "call_ok" and not str(ok["content"]).startswith("Error")
        (output,) = await run_function_calls(
            ledger, [function_call("call_4", "payments_charge", arguments)]
        )
        assert output["call_id"] == "call_4"
        assert str(output["output"]).startswith("Error: A person denied this call (too much)")
        effect = await ledger.find_by_idem_key(pending.value.idem_key)
        assert effect is not None and effect.status is EffectStatus.DENIED
        assert effect.decided_by == "ops"
    assert runs == ["o2"]


async def test_a_pending_call_lets_the_rest_of_its_turn_run(harness: StoreHarness) -> None:
    """The turn's other calls finish and are recorded; sent again, they replay."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs, requires_approval=lambda call: call.args["amount"] > 100)
    turn = [
        chat_call("call_big", "payments_charge", '{"order_id":"big","amount":500}'),
        chat_call("call_small", "payments_charge", '{"order_id":"small","amount":5}'),
    ]
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_calls(ledger, turn, wait_for_approval=False)
        assert runs == ["small"]
        assert await ledger.approve(pending.value.idem_key)
        messages = await run_tool_calls(ledger, turn, wait_for_approval=False)
    assert sorted(runs) == ["big", "small"]
    assert [m["tool_call_id"] for m in messages] == ["call_big", "call_small"]


async def test_approval_waited_for_by_default(harness: StoreHarness) -> None:
    """Without wait_for_approval=False the call waits for the decision, as run() does."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs, requires_approval=True)
    call = chat_call("call_1", "payments_charge", '{"order_id":"o1","amount":5}')
    async with ledger.workflow("conv-1"):
        waiting = asyncio.create_task(run_tool_calls(ledger, [call]))
        while not (pending := await ledger.pending_approvals()):
            await asyncio.sleep(0.01)
        assert not waiting.done()
        assert await ledger.approve(pending[0].idem_key)
        (message,) = await asyncio.wait_for(waiting, 10)
    assert runs == ["o1"] and message["tool_call_id"] == "call_1"


# --- results and failures -------------------------------------------------------------------


async def test_results_reach_the_model_as_text(harness: StoreHarness) -> None:
    """A string as it is; anything else as JSON (sorted keys), the same on a replay."""
    ledger = harness.ledger()

    @ledger.tool("echo")
    def echo(value: Any) -> Any:  # a plain function: runs in a worker thread
        return value

    @ledger.tool("shape")
    async def shape() -> dict[str, object]:
        return {"zeta": 1, "alpha": [1.5, None, True], "mid": {"b": "é", "a": 2}}

    cases = [
        ('{"value": "plain text"}', "plain text"),
        ('{"value": null}', "null"),
        ('{"value": [1, "two"]}', '[1,"two"]'),
        ('{"value": 3}', "3"),
    ]
    async with ledger.workflow("conv-1"):
        for _ in range(2):  # the first run, then replays of the stored JSON
            for i, (arguments, text) in enumerate(cases):
                (message,) = await run_tool_calls(ledger, [chat_call(f"c{i}", "echo", arguments)])
                assert message["content"] == text
            (message,) = await run_tool_calls(ledger, [chat_call("s", "shape", "")])
            assert message["content"] == (
                '{"alpha":[1.5,null,true],"mid":{"a":2,"b":"é"},"zeta":1}'
            )


class CardDeclined(Exception):
    code = "card_declined"


async def test_a_failing_tool_is_answered_the_same_way_every_time(harness: StoreHarness) -> None:
    """The tool's exception is recorded and read to the model; a replay reads the same words."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("payments.charge")
    async def charge(amount: int) -> None:
        runs.append(amount)
        raise CardDeclined(f"card declined for {amount}")

    @ledger.tool("broken")
    def broken() -> None:
        raise ValueError

    async with ledger.workflow("conv-1"):
        turn = [
            chat_call("c1", "payments_charge", '{"amount": 5}'),
            chat_call("c2", "broken", "{}"),
        ]
        first = await run_tool_calls(ledger, turn)
        replay = await run_tool_calls(ledger, turn)
        effect = await ledger.find_by_idem_key(ledger.idem_key(charge.tool_call(5)))
    assert runs == [5]
    assert effect is not None and effect.status is EffectStatus.FAILED
    assert (
        [m["content"] for m in first]
        == [m["content"] for m in replay]
        == [
            "Error: tool 'payments_charge' failed (card_declined): card declined for 5",
            "Error: tool 'broken' failed (ValueError): ValueError",
        ]
    )


async def test_a_result_that_is_not_json_reads_the_same_first_and_on_replay(
    harness: StoreHarness,
) -> None:
    """Regression: the first call raised EffectLedgerValidationError out of run_tool_calls,
    a replay answered the recorded failure. Both answer it now."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("odd.result")
    async def odd(x: int) -> object:
        runs.append(x)
        return {1, 2, 3}

    async with ledger.workflow("conv-1"):
        (first,) = await run_tool_calls(ledger, [chat_call("c1", "odd_result", '{"x": 1}')])
        (replay,) = await run_tool_calls(ledger, [chat_call("c2", "odd_result", '{"x": 1}')])
        effect = await stored(ledger, odd, 1)
    assert runs == [1]
    assert effect.status is EffectStatus.FAILED and effect.error is not None
    assert first["content"] == replay["content"]
    assert first["content"] == (
        f"Error: tool 'odd_result' failed (result_not_serializable): {effect.error.message}"
    )
    assert "set is not a JSON value" in effect.error.message


async def test_a_retried_tool_reads_its_recorded_failure_first_and_on_replay(
    harness: StoreHarness,
) -> None:
    """Regression: the first answer was the last try's exception (ValueError), a replay's
    the recorded retries_exhausted. Both are what was recorded now."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("flaky", retry=RetryPolicy(on=ValueError, attempts=2, initial_ms=1, jitter=0))
    async def flaky(x: int) -> str:
        runs.append(x)
        raise ValueError("card declined")

    async with ledger.workflow("conv-1"):
        first = await run_function_calls(ledger, [function_call("c1", "flaky", '{"x": 1}')])
        replay = await run_function_calls(ledger, [function_call("c2", "flaky", '{"x": 1}')])
        effect = await stored(ledger, flaky, 1)
    assert runs == [1, 1]
    assert effect.error is not None and effect.error.code == "retries_exhausted"
    assert [o["output"] for o in first] == [o["output"] for o in replay]
    assert first[0]["output"] == (
        f"Error: tool 'flaky' failed (retries_exhausted): {effect.error.message}"
    )
    assert "card declined" in effect.error.message


async def test_a_nested_tools_ledger_error_is_the_outer_tools_failure(
    harness: StoreHarness,
) -> None:
    """A tool whose own tool call is denied fails; the model reads it the same every time."""
    ledger = harness.ledger()
    charges: list[int] = []

    @ledger.tool("psp.charge", requires_approval=True)
    async def psp_charge(amount: int) -> str:
        charges.append(amount)
        return "charged"

    @ledger.tool("order.place")
    async def place(amount: int) -> str:
        return await psp_charge(amount)

    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await psp_charge.invoke({"amount": 5}, run_options=NO_WAIT)
        assert await ledger.deny(pending.value.idem_key, reason="no")
        turn = [chat_call("c1", "order_place", '{"amount": 5}')]
        first = await run_tool_calls(ledger, turn)
        replay = await run_tool_calls(ledger, turn)
        outer = await stored(ledger, place, 5)
    assert charges == [] and outer.status is EffectStatus.FAILED
    assert first == replay
    text = str(first[0]["content"])
    assert text.startswith("Error: tool 'order_place' failed (EffectDeniedError): ")
    assert text.endswith("was denied: no")


async def test_a_nested_validation_error_is_the_outer_tools_failure_from_the_first_call(
    harness: StoreHarness,
) -> None:
    """Regression: a tool whose own tool call had bad arguments raised the nested
    EffectLedgerValidationError out of run_tool_calls on the first call, though it was
    recorded as the tool's failure (which every replay answered)."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("inner")
    async def inner(x: int) -> int:
        return x

    @ledger.tool("outer")
    async def outer(x: int) -> int:
        runs.append(x)
        return await inner(y=x)  # a bug in the tool

    async with ledger.workflow("conv-1"):
        first = await run_tool_calls(ledger, [chat_call("c1", "outer", '{"x": 1}')])
        replay = await run_tool_calls(ledger, [chat_call("c2", "outer", '{"x": 1}')])
        effect = await stored(ledger, outer, 1)
    assert runs == [1]
    assert effect.status is EffectStatus.FAILED and effect.error is not None
    assert (
        first[0]["content"]
        == replay[0]["content"]
        == (f"Error: tool 'outer' failed (EffectLedgerValidationError): {effect.error.message}")
    )
    assert "unexpected keyword argument 'y'" in effect.error.message


async def test_a_tool_calling_itself_reads_its_own_failure_not_the_nested_ones(
    harness: StoreHarness,
) -> None:
    """Regression: a ledger error about another effect of the same tool (a tree walk)
    was taken for this call's own outcome, because tool names were compared: the first
    answer quoted the nested failure, every replay the recorded one. Nested denials were
    answered as if this call had been denied."""
    ledger = harness.ledger()
    deleted: list[str] = []
    children = {"/data": ["/data/locked"], "/srv": ["/srv/db"]}

    @ledger.tool("fs.delete_tree", requires_approval=lambda call: call.args["path"] == "/srv/db")
    async def delete_tree(path: str) -> str:
        if path == "/data/locked":
            raise PermissionError(f"{path} is locked")
        for child in children.get(path, []):
            await delete_tree(child)
        deleted.append(path)
        return f"deleted {path}"

    def delete(call_id: str, path: str) -> list[ChatCompletionMessageFunctionToolCall]:
        return [chat_call(call_id, "fs_delete_tree", orjson.dumps({"path": path}).decode())]

    async with ledger.workflow("conv-1"):
        (locked,) = await run_tool_calls(ledger, delete("c1", "/data/locked"))
        first = await run_tool_calls(ledger, delete("c2", "/data"))
        replay = await run_tool_calls(ledger, delete("c3", "/data"))
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_calls(ledger, delete("c4", "/srv/db"), wait_for_approval=False)
        assert await ledger.deny(pending.value.idem_key, reason="that is the database")
        denied_first = await run_tool_calls(ledger, delete("c5", "/srv"))
        denied_replay = await run_tool_calls(ledger, delete("c6", "/srv"))
        (denied,) = await run_tool_calls(ledger, delete("c7", "/srv/db"))
        # the denied call itself: answered as denied, as every denial is
        assert str(denied["content"]).startswith("Error: A person denied this call")
        data = await stored(ledger, delete_tree, "/data")
        srv = await stored(ledger, delete_tree, "/srv")
    assert deleted == []
    assert locked["content"] == (
        "Error: tool 'fs_delete_tree' failed (PermissionError): /data/locked is locked"
    )
    for outer, answers in ((data, (first, replay)), (srv, (denied_first, denied_replay))):
        assert outer.status is EffectStatus.FAILED and outer.error is not None
        assert [a[0]["content"] for a in answers] == [
            f"Error: tool 'fs_delete_tree' failed ({outer.error.code}): {outer.error.message}"
        ] * 2
    assert data.error is not None
    assert "failed [PermissionError]: /data/locked is locked" in data.error.message
    assert srv.error is not None and srv.error.code == "EffectDeniedError"


async def test_a_payload_mismatch_is_answered_and_runs_nothing(harness: StoreHarness) -> None:
    """Same order, another amount: the model is told; the stored charge stands."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge = charge_tool(ledger, runs, validate_keys=["amount"])
    async with ledger.workflow("conv-1"):
        await run_tool_calls(
            ledger, [chat_call("c1", "payments_charge", '{"order_id":"o1","amount":5}')]
        )
        (message,) = await run_tool_calls(
            ledger, [chat_call("c2", "payments_charge", '{"order_id":"o1","amount":6}')]
        )
        effect = await stored(ledger, charge, "o1", 5)
    assert runs == ["o1"]
    assert message["tool_call_id"] == "c2"
    assert str(message["content"]).startswith("Error: ") and "['amount']" in str(message["content"])
    assert effect.status is EffectStatus.SUCCEEDED and effect.args["amount"] == 5


# --- several calls in one turn -----------------------------------------------------------


async def test_calls_of_one_turn_run_concurrently_and_answer_in_order(
    harness: StoreHarness,
) -> None:
    """Neither call can finish before both started; the later-finishing first call is first."""
    ledger = harness.ledger()
    started: list[str] = []
    both = asyncio.Event()
    finished: list[str] = []

    @ledger.tool("step")
    async def step(name: str, delay: float) -> str:
        started.append(name)
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 10)
        await asyncio.sleep(delay)
        finished.append(name)
        return name

    turn = [
        chat_call("c_slow", "step", '{"name": "slow", "delay": 0.2}'),
        chat_call("c_fast", "step", '{"name": "fast", "delay": 0}'),
    ]
    async with ledger.workflow("conv-1"):
        messages = await run_tool_calls(ledger, turn)
    assert finished == ["fast", "slow"]
    assert [(m["tool_call_id"], m["content"]) for m in messages] == [
        ("c_slow", "slow"),
        ("c_fast", "fast"),
    ]


async def test_a_denial_does_not_sink_the_calls_beside_it(harness: StoreHarness) -> None:
    """A denied call beside one in flight: both answered, the other ran and is recorded."""
    ledger = harness.ledger()
    finished: list[str] = []

    @ledger.tool("payments.charge", requires_approval=lambda call: call.args["order_id"] == "no")
    async def charge(order_id: str) -> str:
        await asyncio.sleep(0.2)  # still running when the denial is known
        finished.append(order_id)
        return order_id

    no = chat_call("c_no", "payments_charge", '{"order_id": "no"}')
    yes = chat_call("c_yes", "payments_charge", '{"order_id": "yes"}')
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_calls(ledger, [no], wait_for_approval=False)
        assert await ledger.deny(pending.value.idem_key)
        denied, ran = await run_tool_calls(ledger, [no, yes])
        assert str(denied["content"]).startswith("Error: A person denied this call")
        assert ran["content"] == "yes"
        assert finished == ["yes"]
        effect = await stored(ledger, charge, "yes")
        assert effect.status is EffectStatus.SUCCEEDED
        (message,) = await run_tool_calls(ledger, [yes])  # sent again: a replay
    assert finished == ["yes"] and message["content"] == "yes"


async def test_a_call_canceled_while_it_ran_is_still_raised(harness: StoreHarness) -> None:
    """A canceled effect whose handler had started may have taken effect: the application
    must find out, so that one is raised (after the turn settled), not answered."""
    ledger = harness.ledger()
    started = asyncio.Event()

    @ledger.tool("ops.restart")
    async def restart(service: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return service

    call = chat_call("c1", "ops_restart", '{"service": "db"}')
    async with ledger.workflow("conv-1"):
        first = asyncio.ensure_future(run_tool_calls(ledger, [call]))
        await asyncio.wait_for(started.wait(), 10)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(EffectDeniedError) as raised:
            await run_tool_calls(ledger, [call])
    assert raised.value.status is EffectStatus.CANCELED


# --- Responses API -------------------------------------------------------------------------


async def test_responses_function_calls_among_other_items(harness: StoreHarness) -> None:
    """Only function_call items are run; each output carries its call_id; duplicates run once."""
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs)
    arguments = '{"order_id":"o1","amount":5}'
    output: list[object] = [
        ResponseReasoningItem(id="rs_1", type="reasoning", summary=[]),
        function_call("call_0", "payments_charge", arguments),
        ResponseOutputMessage(
            id="msg_1",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text="Charging.", annotations=[])],
        ),
        *(function_call(f"call_{i}", "payments_charge", arguments) for i in range(1, 4)),
        function_call("call_4", "payments_charge", arguments).model_dump(),
    ]
    async with ledger.workflow("conv-1"):
        outputs = await run_function_calls(ledger, output)
    assert runs == ["o1"]
    assert [o["call_id"] for o in outputs] == [f"call_{i}" for i in range(5)]
    assert {o["type"] for o in outputs} == {"function_call_output"}
    assert len({str(o["output"]) for o in outputs}) == 1
    # What comes back is valid input for the next request.
    items = pydantic.TypeAdapter(list[ResponseInputItemParam]).validate_python(outputs)
    assert len(items) == 5


async def test_responses_pending_then_approved(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    charge_tool(ledger, runs, requires_approval=True)
    call = function_call("call_1", "payments_charge", '{"order_id":"o1","amount":5}')
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_function_calls(ledger, [call], wait_for_approval=False)
        assert runs == []
        assert await ledger.approve(pending.value.idem_key)
        (output,) = await run_function_calls(ledger, [call], wait_for_approval=False)
    assert runs == ["o1"] and output["call_id"] == "call_1"


# --- tool definitions -------------------------------------------------------------------------


class Address(pydantic.BaseModel):
    street: str
    city: str


def definitions_ledger() -> tuple[EffectLedger, Tool[Any]]:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("shipping.send", idempotency_keys=["order_id"])
    async def send(
        order_id: Annotated[str, pydantic.Field(description="The order to ship.")],
        to: Address,
        speed: Literal["standard", "express"] = "standard",
        note: str | None = None,
        *,
        effect: Effect,
    ) -> str:
        """Ship an order.

        Once per order.
        """
        return order_id

    @ledger.tool("ping")
    def ping(anything, /):  # type: ignore[no-untyped-def]  # no annotation: any JSON
        return anything

    return ledger, send


def test_chat_tools_describe_the_signature_without_effect() -> None:
    """Names the API accepts, the docstring, a schema of the arguments; valid SDK params."""
    ledger, _ = definitions_ledger()
    send, ping = chat_tools(ledger)
    assert send["type"] == "function"
    function = send["function"]
    assert function["name"] == "shipping_send"
    assert function.get("description") == "Ship an order.\n\nOnce per order."
    schema = function.get("parameters")
    assert schema is not None
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["order_id", "to"]
    properties: Any = schema["properties"]
    assert list(properties) == ["order_id", "to", "speed", "note"]  # no effect
    assert properties["order_id"] == {"type": "string", "description": "The order to ship."}
    assert properties["speed"] == {
        "enum": ["standard", "express"],
        "type": "string",
        "default": "standard",
    }
    assert properties["note"]["default"] is None
    assert properties["to"] == {"$ref": "#/$defs/Address"}
    assert set(schema["$defs"]["Address"]["required"]) == {"street", "city"}  # type: ignore[index]
    assert ping["function"]["name"] == "ping" and "description" not in ping["function"]
    assert ping["function"].get("parameters") == {
        "additionalProperties": False,
        "properties": {"anything": {}},
        "required": ["anything"],
        "type": "object",
    }
    pydantic.TypeAdapter(list[ChatCompletionFunctionToolParam]).validate_python([send, ping])


def test_responses_tools_are_the_same_in_the_responses_shape() -> None:
    ledger, _ = definitions_ledger()
    chat = chat_tools(ledger)
    responses = responses_tools(ledger)
    pydantic.TypeAdapter(list[FunctionToolParam]).validate_python(responses)
    for c, r in zip(chat, responses, strict=True):
        assert r["type"] == "function" and r["strict"] is False
        assert r["name"] == c["function"]["name"]
        assert r["parameters"] == c["function"].get("parameters")
        assert r.get("description") == c["function"].get("description")


def test_definitions_for_some_tools_by_name_or_tool() -> None:
    ledger, send = definitions_ledger()
    assert [d["function"]["name"] for d in chat_tools(ledger, ["ping", send])] == [
        "ping",
        "shipping_send",
    ]
    assert [d["name"] for d in responses_tools(ledger, [send])] == ["shipping_send"]
    other, _ = definitions_ledger()
    for wrong in (["refund"], [other.tools["ping"]], "ping"):
        with pytest.raises(EffectLedgerValidationError, match="tools"):
            chat_tools(ledger, wrong)


def test_schemas_are_fresh_copies() -> None:
    """Changing one returned schema does not change the next."""
    ledger, _ = definitions_ledger()
    first = chat_tools(ledger)[0]["function"].get("parameters")
    assert first is not None
    first["required"] = []
    assert chat_tools(ledger)[0]["function"].get("parameters", {})["required"] == ["order_id", "to"]


def test_names_the_model_cannot_use_are_refused_when_described() -> None:
    """Two tools the model would see as one name, or a name over 64 characters."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("mail.send")
    async def dotted() -> None: ...

    @ledger.tool("mail_send")
    async def underscored() -> None: ...

    @ledger.tool("sms.send")
    async def sms() -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="both be called 'mail_send'"):
        chat_tools(ledger)
    # Offering only one of them is refused too: a call of `mail_send` would
    # come back to a name both answer to (regression: it ran the other one).
    for chosen in (["mail.send"], ["mail_send"], [dotted], ["sms.send", "mail.send"]):
        with pytest.raises(EffectLedgerValidationError, match="both be called 'mail_send'"):
            chat_tools(ledger, chosen)
        with pytest.raises(EffectLedgerValidationError, match="both be called 'mail_send'"):
            responses_tools(ledger, chosen)
    assert [d["function"]["name"] for d in chat_tools(ledger, ["sms.send"])] == ["sms_send"]

    long = build_ledger(MemoryStore())

    @long.tool("x" * 65)
    async def too_long() -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="at most 64 characters"):
        responses_tools(long)


async def test_a_call_reaches_the_tool_it_was_offered_for(harness: StoreHarness) -> None:
    """`payments_charge` for `payments.charge`; a name two tools answer to runs neither.

    Regression: with `payments.charge` offered as `payments_charge` and a
    quote tool registered as `payments_charge` itself, the model's call of
    the name it was given ran the quote.
    """
    ledger = harness.ledger()
    ran: list[str] = []

    @ledger.tool("payments.charge")
    async def charge(order_id: str) -> str:
        ran.append("payments.charge")
        return "charged"

    async with ledger.workflow("w"):
        (offered,) = chat_tools(ledger, ["payments.charge"])
        name = offered["function"]["name"]
        (message,) = await run_tool_calls(ledger, [chat_call("a", name, '{"order_id":"o1"}')])
        assert message["content"] == "charged" and ran == ["payments.charge"]

        @ledger.tool("payments_charge")  # registered after the definitions were sent
        async def quote(order_id: str) -> str:
            ran.append("payments_charge")
            return "quote only"

        ambiguous = r"tools \['payments.charge', 'payments_charge'\] .* which one it meant"
        with pytest.raises(EffectLedgerValidationError, match=ambiguous):
            await run_tool_calls(ledger, [chat_call("b", name, '{"order_id":"o2"}')])
        with pytest.raises(EffectLedgerValidationError, match=ambiguous):
            await run_function_calls(ledger, [function_call("c", name, '{"order_id":"o2"}')])
        # A name no tool is described as still reaches the tool registered under it.
        (message,) = await run_tool_calls(ledger, [chat_call("d", "sms_send", "{}")])
        assert str(message["content"]).startswith("Error: there is no tool named 'sms_send'")
        (message,) = await run_tool_calls(
            ledger, [chat_call("e", "payments.charge", '{"order_id":"o3"}')]
        )
        assert message["content"] == "charged"
    assert ran == ["payments.charge", "payments.charge"]
    assert await harness.raw_count() == 2


class Opaque:
    pass


def test_a_signature_without_a_json_schema_is_refused() -> None:
    ledger = build_ledger(MemoryStore())

    @ledger.tool("opaque")
    async def opaque(thing: Opaque) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="no JSON schema"):
        chat_tools(ledger)

    unresolved = build_ledger(MemoryStore())

    @unresolved.tool("later")
    async def later(thing: NotDefinedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(
        EffectLedgerValidationError,
        match="cannot evaluate the annotation 'NotDefinedAnywhere' of 'thing'",
    ):
        responses_tools(unresolved)


# --- packaging ---------------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    done = _python(
        "import sys; sys.modules['openai'] = None\nimport agent_ledger.adapters.openai\n"
    )
    assert done.returncode != 0
    assert 'pip install "agent-ledger[openai]"' in done.stderr
