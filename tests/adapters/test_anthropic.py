"""The Anthropic adapter: ``tool_use`` blocks in, ``tool_result`` blocks out, on every store.

The model's blocks are the SDK's own objects (and their dicts), built here
as the API would have returned them; no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import orjson
import pydantic
import pytest
from anthropic.types import (
    Message,
    MessageParam,
    TextBlock,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlock,
)

from agent_ledger import (
    ApprovalPendingError,
    Effect,
    EffectDeniedError,
    EffectLedger,
    EffectLedgerValidationError,
    MemoryStore,
    RunOptions,
)
from agent_ledger.adapters.anthropic import run_tool_uses, tool_definitions
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool
from tests.harness import StoreHarness


def tool_use(block_id: str, name: str, arguments: dict[str, object]) -> ToolUseBlock:
    """A ``tool_use`` block as ``message.content`` holds it."""
    return ToolUseBlock(id=block_id, name=name, input=arguments, type="tool_use")


def message(*blocks: object) -> Message:
    """A whole response, parsed from the JSON the API would send."""
    return Message.model_validate(
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
        results = await run_tool_uses(ledger, response.content)
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
    pydantic.TypeAdapter(MessageParam).validate_python(reply)


async def test_a_tool_use_repeated_over_five_turns_runs_once(harness: StoreHarness) -> None:
    """A new id each turn, objects or dicts: one run, the first id on the receipt."""
    ledger = harness.ledger()
    runs: list[str] = []
    book = book_tool(ledger, runs)
    results = []
    async with ledger.workflow("conv-1"):
        for i in range(5):
            block = tool_use(f"toolu_{i}", "travel_book", {"trip": "t1", "seats": 1})
            (result,) = await run_tool_uses(ledger, [block if i % 2 else block.model_dump()])
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
        assert await run_tool_uses(ledger, [TextBlock(type="text", text="hello")]) == []
        assert await run_tool_uses(ledger, None) == []
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
        (result,) = await run_tool_uses(ledger, [block])
    assert result["tool_use_id"] == "toolu_1" and result.get("is_error") is True
    content = result.get("content")
    assert isinstance(content, str) and content.startswith("Error: ") and says in content
    assert runs == [] and await harness.raw_count() == 0


async def test_a_block_without_an_id_is_refused_before_anything_runs(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs)
    good = tool_use("toolu_1", "travel_book", {"trip": "t1"})
    async with ledger.workflow("conv-1"):
        with pytest.raises(EffectLedgerValidationError, match="'id'"):
            await run_tool_uses(ledger, [good, {"type": "tool_use", "name": "travel_book"}])
    assert runs == [] and await harness.raw_count() == 0


async def test_pending_approval_raises_then_runs_once_after_approve(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs, requires_approval=True)
    block = tool_use("toolu_1", "travel_book", {"trip": "t1"})
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_uses(ledger, [block], wait_for_approval=False)
        with pytest.raises(ApprovalPendingError):
            await run_tool_uses(
                ledger,
                [tool_use("toolu_2", "travel_book", {"trip": "t1"})],
                run_options=RunOptions(wait_for_approval=False),
            )
        assert runs == []
        assert await ledger.approve(pending.value.idem_key, by="ops")
        (first,) = await run_tool_uses(ledger, [block], wait_for_approval=False)
        (again,) = await run_tool_uses(ledger, [block])
    assert runs == ["t1"] and first == again and first["tool_use_id"] == "toolu_1"


async def test_denied_tool_use_sent_again_raises_and_never_runs(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    runs: list[str] = []
    book_tool(ledger, runs, requires_approval=True)
    async with ledger.workflow("conv-1"):
        with pytest.raises(ApprovalPendingError) as pending:
            await run_tool_uses(
                ledger,
                [tool_use("toolu_1", "travel_book", {"trip": "t1"})],
                wait_for_approval=False,
            )
        assert await ledger.deny(pending.value.idem_key, reason="over budget")
        for block_id in ("toolu_1", "toolu_2"):
            with pytest.raises(EffectDeniedError, match="over budget"):
                await asyncio.wait_for(
                    run_tool_uses(ledger, [tool_use(block_id, "travel_book", {"trip": "t1"})]), 10
                )
    assert runs == []


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
        (first,) = await run_tool_uses(ledger, [block])
        (replay,) = await run_tool_uses(ledger, [block])
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
    pydantic.TypeAdapter(ToolResultBlockParam).validate_python(first)


async def test_results_that_are_not_strings_are_json(harness: StoreHarness) -> None:
    ledger = harness.ledger()

    @ledger.tool("say")
    async def say(text: str, loud: bool = False) -> str | list[str]:
        return text.upper() if loud else [text]

    async with ledger.workflow("conv-1"):
        results = await run_tool_uses(
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
    (definition,) = tool_definitions(ledger)
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
    pydantic.TypeAdapter(list[ToolParam]).validate_python([definition])
    assert tool_definitions(ledger, []) == []
    with pytest.raises(EffectLedgerValidationError, match="not a tool registered"):
        tool_definitions(ledger, ["travel_book"])  # the registered name is travel.book


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    done = _python(
        "import sys; sys.modules['anthropic'] = None\nimport agent_ledger.adapters.anthropic\n"
    )
    assert done.returncode != 0
    assert 'pip install "agent-ledger[anthropic]"' in done.stderr
