"""The Anthropic adapter: ``tool_use`` blocks in, ``tool_result`` blocks out, on every store.

The model's blocks are the SDK's own objects (and their dicts), built here
as the API would have returned them; no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import orjson
import pydantic
import pytest

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectLedger,
    EffectLedgerValidationError,
    MemoryStore,
    RunOptions,
)
from agent_ledger.retries import RetryPolicy
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool
from tests.harness import StoreHarness
from tests.lazy import lazy

if TYPE_CHECKING:
    import anthropic.types as at
    from anthropic.types import Message, MessageParam, ToolUseBlock

    from agent_ledger.adapters import anthropic as adapter
else:  # imported by the first test that runs, not at collection
    at = lazy("anthropic.types")
    adapter = lazy("agent_ledger.adapters.anthropic")


def tool_use(block_id: str, name: str, arguments: dict[str, object]) -> ToolUseBlock:
    """A ``tool_use`` block as ``message.content`` holds it."""
    return at.ToolUseBlock(id=block_id, name=name, input=arguments, type="tool_use")


def message(*blocks: object) -> Message:
    """A whole response, parsed from the JSON the API would send."""
    return at.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": list(blocks),
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    )


def book_tool(ledger: EffectLedger, runs: list[str], **options: Any) -> Tool[dict[str, object]]:
    """``travel.book``, keyed on the trip, recording each real run in ``runs``."""

    @ledger.tool("travel.book", idempotency_keys=["trip"], **options)
    async def book(trip: str, seats: int = 1, *, effect: Effect) -> dict[str, object]:
        """Book seats on a trip."""
        runs.append(trip)
        return {"trip": trip, "seats": seats, "booking": effect.idem_key[:8]}

    return book


async def stored(ledger: EffectLedger, tool: Tool[Any], *args: object) -> Effect:
    effect = await ledger.find_by_idem_key(ledger.idem_key(tool.tool_call(*args)))
    assert effect is not None
    return effect


async def test_five_duplicate_tool_uses_run_once(harness: StoreHarness) -> None:
    """Five blocks with one key and five ids: one run, five results each with its own id."""
    ledger = harness.ledger()
    runs: list[str] = []
    book = book_tool(ledger, runs)
    response = message(
        {"type": "text", "text": "Booking."},
        *(
            {"type": "tool_use", "id": f"toolu_{i}", "name": "travel_book", "input": {"trip": "t1"}}
            for i in range(5)
        ),
    )
    async with ledger.workflow("conv-1"):
        results = await adapter.run_tool_uses(ledger, response.content)
        effect = await stored(ledger, book, "t1")
    assert runs == ["t1"]
    assert [r["tool_use_id"] for r in results] == [f"toolu_{i}" for i in range(5)]
    assert all(r["type"] == "tool_result" and "is_error" not in r for r in results)
    assert len({str(r.get("content")) for r in results}) == 1
    assert orjson.loads(str(results[0].get("content")))["seats"] == 1
    assert effect.call_id in {f"toolu_{i}" for i in range(5)} and effect.dedup_count == 4
    assert await harness.raw_count() == 1
    # The results are the content of a valid next user message.
    reply: MessageParam = {"role": "user", "content": results}
    pydantic.TypeAdapter(at.MessageParam).validate_python(reply)


async def test_a_tool_use_repeated_over_five_turns_runs_once(harness: StoreHarness) -> None:
    """A new id each turn, objects or dicts: one run, the first id on the receipt."""
    ledger = harness.ledger()
    runs: list[str] = []
    book = book_tool(ledger, runs)
    results = []
    async with ledger.workflow("conv-1"):
        for i in range(5):
            block = tool_use(f"toolu_{i}", "travel_book", {"trip": "t1", "seats": 1})
            (result,) = await adapter.run_tool_uses(
                ledger, [block if i % 2 else block.model_dump()]
            )
            results.append(result)
        effect = await stored(ledger, book, "t1")
        assert await book("t1") == orjson.loads(str(results[0].get("content")))
    assert runs == ["t1"] and effect.call_id == "toolu_0"
    assert [r["tool_use_id"] for r in results] == [f"toolu_{i}" for i in range(5)]
    assert len({str(r.get("content")) for r in results}) == 1


async def test_blocks_other_than_tool_use_are_skipped(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs)
    async with ledger.workflow("conv-1"):
        assert await adapter.run_tool_uses(ledger, [at.TextBlock(type="text", text="hello")]) == []
        assert await adapter.run_tool_uses(ledger, None) == []
    assert runs == [] and await harness.raw_count() == 0


MALFORMED = {
    "an unknown tool": ("travel_cancel", {"trip": "t1"}, "no tool named 'travel_cancel'"),
    "a missing argument": ("travel_book", {"seats": 2}, "missing required arguments"),
    "an unexpected argument": ("travel_book", {"trip": "t1", "class": "first"}, "'class'"),
    "input that is not an object": ("travel_book", ["t1"], "must be JSON text or an object"),
}


@pytest.mark.parametrize(("name", "arguments", "says"), MALFORMED.values(), ids=list(MALFORMED))
async def test_malformed_tool_use_is_an_error_result_and_stores_nothing(
    harness: StoreHarness, name: str, arguments: object, says: str
) -> None:
    """is_error: true, the reason for the model, under the block's id; the store stays empty."""
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs)
    block = {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}
    async with ledger.workflow("conv-1"):
        (result,) = await adapter.run_tool_uses(ledger, [block])
    assert result["tool_use_id"] == "toolu_1" and result.get("is_error") is True
    content = result.get("content")
    assert isinstance(content, str) and content.startswith("Error: ") and says in content
    assert runs == [] and await harness.raw_count() == 0


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


#: Decoded input the ledger cannot keep as sent: the SDK hands Python values over.
UNSTORABLE: dict[str, tuple[dict[Any, object], str]] = {
    "over max_args_size_bytes": ({"note": "a" * 1_100_000}, "over max_args_size_bytes"),
    "nested too deep": ({"note": nested(200)}, "args['note'][0]"),
    "an integer beyond 64 bits": ({"note": 2**70}, "does not fit in 64 bits"),
    "a negative one": ({"note": [-(2**63) - 1]}, "does not fit in 64 bits"),
    "NaN": ({"note": float("nan")}, "nan is not allowed"),
    "Infinity": ({"note": {"k": float("-inf")}}, "-inf is not allowed"),
    "a lone surrogate": ({"note": "\ud800"}, "args"),
    "a lone surrogate in a nested key": ({"note": {"\udc00": 1}}, "args"),
    "a key that is not a string": ({"note": {"a": {1: "b"}}}, "keys must be str"),
    "a top-level key that is not a string": ({"note": 1, 2: 3}, "unexpected keyword argument 2"),
}


@pytest.mark.parametrize(("arguments", "says"), UNSTORABLE.values(), ids=list(UNSTORABLE))
async def test_input_the_ledger_cannot_keep_is_an_error_result_not_raised(
    harness: StoreHarness, arguments: dict[Any, object], says: str
) -> None:
    """Regression: these raised EffectLedgerValidationError out of run_tool_uses.

    The model sent them, so the model reads what was wrong (is_error); nothing
    runs or is stored, and the message's other blocks are answered as usual.
    """
    ledger = harness.ledger()
    runs: list[object] = []

    @ledger.tool("notes.add")
    async def add(note: object) -> str:
        runs.append(note)
        return "added"

    blocks = [
        {"type": "tool_use", "id": "toolu_1", "name": "notes_add", "input": arguments},
        tool_use("toolu_2", "notes_add", {"note": 1}),
    ]
    async with ledger.workflow("conv-1"):
        bad, good = await adapter.run_tool_uses(ledger, blocks)
    content = bad.get("content")
    assert bad.get("is_error") is True and isinstance(content, str)
    assert content.startswith("Error: the arguments for tool 'notes_add' were refused")
    assert says in content
    assert good.get("content") == "added" and "is_error" not in good
    assert runs == [1]
    assert await harness.raw_count() == 1


async def test_integers_beyond_64_bits_are_refused_not_merged(harness: StoreHarness) -> None:
    """Regression: two accounts past 64 bits, as the SDK decodes them (Python ints), raised;
    they must never share a key either. Each is an error result; nothing is stored."""
    ledger = harness.ledger()
    runs: list[int] = []

    @ledger.tool("bank.transfer")
    async def transfer(account: int, amount: int) -> str:
        runs.append(account)
        return f"sent {amount} to {account}"

    async with ledger.workflow("w1"):
        refused = await adapter.run_tool_uses(
            ledger,
            [
                tool_use("toolu_1", "bank_transfer", {"account": 2**64, "amount": 5}),
                tool_use("toolu_2", "bank_transfer", {"account": 2**64 + 1, "amount": 5}),
            ],
        )
        assert await harness.raw_count() == 0
        (ran,) = await adapter.run_tool_uses(
            ledger, [tool_use("toolu_3", "bank_transfer", {"account": 2**64 - 1, "amount": 5})]
        )
    for result, account in zip(refused, (2**64, 2**64 + 1), strict=True):
        assert result.get("is_error") is True
        assert f"integer {account} does not fit in 64 bits" in str(result.get("content"))
    assert ran.get("content") == f"sent 5 to {2**64 - 1}"
    assert runs == [2**64 - 1]
    assert await harness.raw_count() == 1


async def test_a_block_without_an_id_is_refused_before_anything_runs(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs)
    good = tool_use("toolu_1", "travel_book", {"trip": "t1"})
    async with ledger.workflow("conv-1"):
        with pytest.raises(EffectLedgerValidationError, match="'id'"):
            await adapter.run_tool_uses(ledger, [good, {"type": "tool_use", "name": "travel_book"}])
    assert runs == [] and await harness.raw_count() == 0


async def test_pending_approval_raises_then_runs_once_after_approve(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs, requires_approval=True)
    block = tool_use("toolu_1", "travel_book", {"trip": "t1"})
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await adapter.run_tool_uses(ledger, [block], wait_for_approval=False)
        with pytest.raises(ApprovalPendingError):
            await adapter.run_tool_uses(
                ledger,
                [tool_use("toolu_2", "travel_book", {"trip": "t1"})],
                run_options=RunOptions(wait_for_approval=False),
            )
        assert runs == []
        assert await ledger.approve(pending.value.idem_key, by="ops")
        (first,) = await adapter.run_tool_uses(ledger, [block], wait_for_approval=False)
        (again,) = await adapter.run_tool_uses(ledger, [block])
    assert runs == ["t1"] and first == again and first["tool_use_id"] == "toolu_1"


async def test_a_denied_tool_use_is_an_error_result_and_never_runs(
    harness: StoreHarness,
) -> None:
    """Anthropic wants a tool_result for every tool_use: a denial is one, with is_error."""
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs, requires_approval=lambda call: call.args["trip"] == "t1")
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await adapter.run_tool_uses(
                ledger,
                [tool_use("toolu_1", "travel_book", {"trip": "t1"})],
                wait_for_approval=False,
            )
        assert await ledger.deny(pending.value.idem_key, reason="over budget")
        for block_id in ("toolu_1", "toolu_2"):
            denied, booked = await asyncio.wait_for(
                adapter.run_tool_uses(
                    ledger,
                    [
                        tool_use(block_id, "travel_book", {"trip": "t1"}),
                        tool_use("toolu_ok", "travel_book", {"trip": "t2"}),
                    ],
                ),
                10,
            )
            assert denied["tool_use_id"] == block_id and denied.get("is_error") is True
            assert "A person denied this call (over budget)" in str(denied["content"])
            assert booked["tool_use_id"] == "toolu_ok" and "is_error" not in booked
    assert runs == ["t2"]


class SoldOut(Exception):
    code = "sold_out"


async def test_a_failing_tool_is_an_error_result_the_same_every_time(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []

    @ledger.tool("travel.book")
    def book(trip: str) -> None:
        runs.append(trip)
        raise SoldOut(f"no seats left on {trip}")

    block = tool_use("toolu_1", "travel_book", {"trip": "t1"})
    async with ledger.workflow("conv-1"):
        (first,) = await adapter.run_tool_uses(ledger, [block])
        (replay,) = await adapter.run_tool_uses(ledger, [block])
    assert runs == ["t1"]
    assert (
        first
        == replay
        == {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "Error: tool 'travel_book' failed (sold_out): no seats left on t1",
            "is_error": True,
        }
    )
    pydantic.TypeAdapter(at.ToolResultBlockParam).validate_python(first)


async def test_recorded_failures_read_the_same_first_and_on_replay(harness: StoreHarness) -> None:
    """Regression: a non-JSON result raised the first time; a retried tool's first answer
    was its last exception, not the recorded retries_exhausted. Both read the record now."""
    ledger = harness.ledger()

    @ledger.tool("odd.result")
    async def odd(x: int) -> object:
        return {x}

    @ledger.tool("flaky", retry=RetryPolicy(on=ValueError, attempts=2, initial_ms=1, jitter=0))
    async def flaky(x: int) -> str:
        raise ValueError("sold out")

    turn = [tool_use("toolu_1", "odd_result", {"x": 1}), tool_use("toolu_2", "flaky", {"x": 1})]
    async with ledger.workflow("conv-1"):
        first = await adapter.run_tool_uses(ledger, turn)
        replay = await adapter.run_tool_uses(ledger, turn)
        effects = [await stored(ledger, odd, 1), await stored(ledger, flaky, 1)]
    assert first == replay
    for result, effect, name in zip(first, effects, ("odd_result", "flaky"), strict=True):
        assert effect.error is not None and result.get("is_error") is True
        assert result.get("content") == (
            f"Error: tool {name!r} failed ({effect.error.code}): {effect.error.message}"
        )
    assert [e.error.code for e in effects if e.error] == [
        "result_not_serializable",
        "retries_exhausted",
    ]


async def test_results_that_are_not_strings_are_json(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("say")
    async def say(text: str, loud: bool = False) -> str | list[str]:
        return text.upper() if loud else [text]

    async with ledger.workflow("conv-1"):
        results = await adapter.run_tool_uses(
            ledger,
            [
                tool_use("a", "say", {"text": "hi", "loud": True}),
                tool_use("b", "say", {"text": "hi"}),
            ],
        )
    assert [r.get("content") for r in results] == ["HI", '["hi"]']


def test_tool_definitions_describe_the_signature_without_effect() -> None:
    ledger = build_ledger(MemoryStore())
    book_tool(ledger, [])
    (definition,) = adapter.tool_definitions(ledger)
    assert definition == {
        "name": "travel_book",
        "description": "Book seats on a trip.",
        "input_schema": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"trip": {"type": "string"}, "seats": {"type": "integer", "default": 1}},
            "required": ["trip"],
        },
    }
    pydantic.TypeAdapter(list[at.ToolParam]).validate_python([definition])
    assert adapter.tool_definitions(ledger, []) == []
    with pytest.raises(EffectLedgerValidationError, match="not a tool registered"):
        adapter.tool_definitions(ledger, ["travel_book"])  # the registered name is travel.book


async def test_a_name_two_tools_answer_to_is_never_offered_or_run(harness: StoreHarness) -> None:
    """Regression: `travel.book` was offered as `travel_book` beside a tool registered as
    `travel_book`, and the model's call of the name it was given ran that other tool."""
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs)

    @ledger.tool("travel_book")
    async def quote(trip: str) -> str:
        runs.append("quote")
        return "quote only"

    for chosen in (None, ["travel.book"], ["travel_book"]):
        with pytest.raises(EffectLedgerValidationError, match="both be called 'travel_book'"):
            adapter.tool_definitions(ledger, chosen)
    async with ledger.workflow("conv-1"):
        with pytest.raises(EffectLedgerValidationError, match="which one it meant"):
            await adapter.run_tool_uses(
                ledger, [tool_use("toolu_1", "travel_book", {"trip": "t1"})]
            )
    assert runs == [] and await harness.raw_count() == 0


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    done = _python(
        "import sys; sys.modules['anthropic'] = None\nimport agent_ledger.adapters.anthropic\n"
    )
    assert done.returncode != 0
    assert 'pip install "agent-ledger[anthropic]"' in done.stderr
