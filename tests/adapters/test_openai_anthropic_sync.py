"""The adapters' sync variants, for synchronous agent loops, on every store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
)
from agent_ledger.sync import open_ledger
from tests.harness import DSN, TEST_SCHEMA, ensure_test_schema, require_postgres
from tests.lazy import lazy

if TYPE_CHECKING:
    import anthropic.types as anthropic_types
    import openai.types.chat as chat_types
    import openai.types.chat.chat_completion_message_function_tool_call as function_call
    import openai.types.responses as responses_types
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    from agent_ledger.adapters import anthropic as anthropic_adapter
    from agent_ledger.adapters import openai as openai_adapter
else:  # imported by the first test that runs, not at collection
    anthropic_types = lazy("anthropic.types")
    chat_types = lazy("openai.types.chat")
    function_call = lazy("openai.types.chat.chat_completion_message_function_tool_call")
    responses_types = lazy("openai.types.responses")
    anthropic_adapter = lazy("agent_ledger.adapters.anthropic")
    openai_adapter = lazy("agent_ledger.adapters.openai")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EffectLedger]:
    """A ledger opened for sync code: its store lives on the ledger's background loop."""
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


def unique(prefix: str) -> str:
    """A workflow id of this test alone: the PostgreSQL schema is shared by the session."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def chat_call(call_id: str, arguments: str) -> ChatCompletionMessageFunctionToolCall:
    return chat_types.ChatCompletionMessageFunctionToolCall(
        id=call_id,
        type="function",
        function=function_call.Function(name="ops_restart", arguments=arguments),
    )


def register_restart(ledger: EffectLedger, runs: list[str], *, approval: bool = False) -> None:
    @ledger.tool("ops.restart", requires_approval=approval)
    def restart(service: str) -> str:
        runs.append(service)
        return f"restarted {service}"


def test_five_duplicates_run_once_from_sync_code(ledger: EffectLedger) -> None:
    """Chat, Responses and Anthropic spellings of one call, ten ids: one run."""
    runs: list[str] = []
    register_restart(ledger, runs)
    with ledger.workflow(unique("incident")):
        chat = openai_adapter.run_tool_calls_sync(
            ledger, [chat_call(f"call_{i}", '{"service": "api"}') for i in range(5)]
        )
        responses = openai_adapter.run_function_calls_sync(
            ledger,
            [
                responses_types.ResponseFunctionToolCall(
                    call_id=f"fc_{i}",
                    name="ops_restart",
                    arguments='{"service": "api"}',
                    type="function_call",
                )
                for i in range(5)
            ],
        )
        claude = anthropic_adapter.run_tool_uses_sync(
            ledger,
            [
                anthropic_types.ToolUseBlock(
                    id=f"toolu_{i}", name="ops_restart", input={"service": "api"}, type="tool_use"
                )
                for i in range(5)
            ],
        )
    assert runs == ["api"]
    assert [m["tool_call_id"] for m in chat] == [f"call_{i}" for i in range(5)]
    assert [o["call_id"] for o in responses] == [f"fc_{i}" for i in range(5)]
    assert [r["tool_use_id"] for r in claude] == [f"toolu_{i}" for i in range(5)]
    texts = {m["content"] for m in chat} | {o["output"] for o in responses}
    assert texts | {r.get("content") for r in claude} == {"restarted api"}


def test_approve_then_deny_from_sync_code(ledger: EffectLedger) -> None:
    """Pending raises at once; approved runs once; denied is answered and never runs."""
    runs: list[str] = []
    register_restart(ledger, runs, approval=True)
    workflow = unique("incident")
    with ledger.workflow(workflow):
        for service in ("api", "db"):
            with pytest.raises(ApprovalPendingError):
                openai_adapter.run_tool_calls_sync(
                    ledger,
                    [chat_call(f"c_{service}", f'{{"service": "{service}"}}')],
                    wait_for_approval=False,
                )
        pending = {
            e.args["service"]: e
            for e in ledger.call_sync(ledger.pending_approvals)
            if e.workflow_id == workflow
        }
        assert set(pending) == {"api", "db"}
        assert all(e.status is EffectStatus.REQUIRES_APPROVAL for e in pending.values())
        assert ledger.call_sync(ledger.approve, pending["api"].idem_key)
        assert ledger.call_sync(ledger.deny, pending["db"].idem_key, reason="not now")

        for _ in range(2):
            (message,) = openai_adapter.run_tool_calls_sync(
                ledger, [chat_call("c_api_again", '{"service": "api"}')], wait_for_approval=False
            )
            assert message["content"] == "restarted api"
            (denied,) = anthropic_adapter.run_tool_uses_sync(
                ledger,
                [
                    {
                        "type": "tool_use",
                        "id": "toolu_db",
                        "name": "ops_restart",
                        "input": {"service": "db"},
                    }
                ],
            )
            assert denied.get("is_error") is True and "(not now)" in str(denied["content"])
    assert runs == ["api"]


async def test_sync_variants_refuse_a_running_event_loop() -> None:
    """On an event loop, blocking would stall it: raised, nothing runs."""
    ledger = open_ledger("memory://")
    runs: list[str] = []
    register_restart(ledger, runs)
    try:
        with ledger.workflow("w"), pytest.raises(EffectLedgerValidationError, match="event loop"):
            openai_adapter.run_tool_calls_sync(ledger, [chat_call("c", '{"service": "api"}')])
    finally:
        await asyncio.to_thread(ledger.close_sync)
    assert runs == []
