"""CrewAI: ledger tools as CrewAI ``BaseTool``s, and CrewAI tools run through the ledger.

CrewAI's own tool objects throughout (``BaseTool.run``/``arun``, its schema
validation, ``crewai.tools.tool``). CrewAI pins older mcp/openai/pydantic than
the other extras, so these tests run in a virtualenv of their own (``.ci/run``:
``pytest -m crewai``); elsewhere they are skipped with one line, and with
``AGENT_LEDGER_REQUIRE_CREWAI=1`` (as that step sets) they fail instead.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

import pytest

from agent_ledger import (
    Effect,
    EffectFailedError,
    EffectLedger,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    SqliteStore,
)
from agent_ledger.sync import open_ledger

pytestmark = pytest.mark.crewai

if os.environ.get("AGENT_LEDGER_REQUIRE_CREWAI") == "1":
    import crewai  # noqa: F401  # fail, not skip, where CrewAI must be tested
else:
    pytest.importorskip("crewai", reason="CrewAI is tested in its own virtualenv (.ci/run)")

from crewai.tools import BaseTool, tool  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from agent_ledger.adapters.crewai import (  # noqa: E402
    LedgerCrewTool,
    as_crewai_tool,
    wrap_crewai_tool,
)


class Color(enum.Enum):
    RED = "red"


def _ledger(tmp_path: Path) -> EffectLedger:
    return EffectLedger(EffectLedgerOptions(store=SqliteStore(str(tmp_path / "l.db"))))


def _charge(ledger: EffectLedger, runs: list[str], **options: Any) -> Any:
    @ledger.tool("payments.charge", idempotency_keys=["order_id"], **options)
    async def charge(
        order_id: str,
        amount: int,
        color: Color = "red",  # type: ignore[assignment]  # a default is JSON, as sent
        *,
        effect: Effect,
    ) -> dict[str, Any]:
        """Charge an order once."""
        runs.append(order_id)
        return {"order": order_id, "amount": amount, "color": color}

    return charge


async def test_a_ledger_tool_is_a_crewai_tool_that_runs_once_per_key(tmp_path: Path) -> None:
    """``as_crewai_tool`` gives a ``BaseTool`` (schema from the signature, effect left
    out); three runs with the same arguments charge once and answer alike."""
    ledger = _ledger(tmp_path)
    runs: list[str] = []
    crew_tool = as_crewai_tool(_charge(ledger, runs))
    assert isinstance(crew_tool, BaseTool) and isinstance(crew_tool, LedgerCrewTool)
    assert crew_tool.name == "payments_charge"
    assert set(crew_tool.args_schema.model_fields) == {"order_id", "amount", "color"}
    assert "Charge an order once." in crew_tool.description
    async with ledger.workflow("crew-1"):
        answers = [await crew_tool.arun(order_id="o1", amount=5, color="red") for _ in range(3)]
    assert runs == ["o1"]
    # The enum arrived as its JSON value (the key is made of JSON), on every answer.
    assert answers == [{"order": "o1", "amount": 5, "color": "red"}] * 3
    await ledger.store.close()


def test_sync_run_goes_through_the_ledger_too(tmp_path: Path) -> None:
    """``BaseTool.run`` (what a crew calls from its worker threads) is one ledger call."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    runs: list[str] = []
    try:
        crew_tool = as_crewai_tool(_charge(ledger, runs))
        with ledger.workflow("crew-2"):
            first = crew_tool.run(order_id="o2", amount=7)
            again = crew_tool.run(order_id="o2", amount=7)
    finally:
        ledger.close_sync()
    assert first == again == {"order": "o2", "amount": 7, "color": "red"}
    assert runs == ["o2"]


async def test_bad_arguments_are_refused_by_crewai_before_anything_is_stored(
    tmp_path: Path,
) -> None:
    """CrewAI's schema validation refuses a wrong type (ValueError); nothing is stored."""
    ledger = _ledger(tmp_path)
    runs: list[str] = []
    crew_tool = as_crewai_tool(_charge(ledger, runs))
    async with ledger.workflow("crew-3"):
        with pytest.raises(ValueError, match="arguments validation failed"):
            await crew_tool.arun(order_id="o3", amount="lots")
    assert runs == []
    assert (await ledger.list_effects(workflow_id="crew-3")).effects == []
    await ledger.store.close()


async def test_a_pending_approval_and_a_denial_are_told_to_the_agent(tmp_path: Path) -> None:
    """A call waiting for a person answers the agent that it waits; once denied (by
    ``ops``), the same call answers that a person denied it; nothing ran."""
    ledger = _ledger(tmp_path)
    runs: list[str] = []
    crew_tool = as_crewai_tool(_charge(ledger, runs, requires_approval=True))
    async with ledger.workflow("crew-4"):
        waiting = await crew_tool.arun(order_id="o4", amount=9)
        assert "needs a person's approval" in waiting
        (effect,) = (await ledger.list_effects(workflow_id="crew-4")).effects
        await ledger.deny(effect.idem_key, reason="over budget", by="ops")
        denied = await crew_tool.arun(order_id="o4", amount=9)
    assert "A person denied this call (over budget)" in denied
    assert runs == []
    stored = await ledger.find_by_idem_key(effect.idem_key)
    assert stored is not None and stored.status is EffectStatus.DENIED
    assert stored.decided_by == "ops"
    await ledger.store.close()


async def test_a_crewai_tool_wrapped_runs_once_and_its_failure_replays(tmp_path: Path) -> None:
    """``wrap_crewai_tool`` over a ``@tool``-made CrewAI tool: same name, description and
    schema; repeats run it once; a failure is recorded and replayed, not rerun."""
    ledger = _ledger(tmp_path)
    sent: list[str] = []

    @tool("send_mail")  # type: ignore[untyped-decorator]
    def send_mail(to: str, text: str = "hello") -> str:
        """Send a mail to someone."""
        if to == "nobody":
            raise RuntimeError("no such mailbox")
        sent.append(to)
        return f"sent to {to}"

    wrapped = wrap_crewai_tool(ledger, send_mail, "mail.send", idempotency_keys=["to"])
    assert wrapped.name == "send_mail" and wrapped.description == send_mail.description
    assert wrapped.ledger_tool is ledger.tools["mail.send"]
    async with ledger.workflow("crew-5"):
        assert await wrapped.arun(to="ada") == "sent to ada"
        assert await wrapped.arun(to="ada") == "sent to ada"
        with pytest.raises(RuntimeError, match="no such mailbox"):
            await wrapped.arun(to="nobody")
        with pytest.raises(EffectFailedError, match="no such mailbox"):
            await wrapped.arun(to="nobody")
    assert sent == ["ada"]
    await ledger.store.close()


def test_a_crewai_subclass_tool_can_be_wrapped(tmp_path: Path) -> None:
    """A ``BaseTool`` subclass with its own ``args_schema`` wraps the same way."""
    lookups: list[str] = []

    class Query(BaseModel):
        sku: str

    class Stock(BaseTool):  # type: ignore[misc]
        name: str = "stock"
        description: str = "How many are in stock."
        args_schema: type[BaseModel] = Query

        def _run(self, sku: str) -> int:
            lookups.append(sku)
            return 3

    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        wrapped = wrap_crewai_tool(ledger, Stock(), "shop.stock")
        with ledger.workflow("crew-6"):
            assert wrapped.run(sku="x") == wrapped.run(sku="x") == 3
    finally:
        ledger.close_sync()
    assert lookups == ["x"]


def test_a_crewai_tool_with_a_default_factory_field_is_refused(tmp_path: Path) -> None:
    """A schema field with a ``default_factory`` would get a new value, so a new key,
    on every run: wrapping the tool is refused, naming the field, and registers nothing."""

    class Order(BaseModel):
        sku: str
        token: str = Field(default_factory=lambda: "fresh on every run")

    class Place(BaseTool):  # type: ignore[misc]
        name: str = "place"
        description: str = "Place an order."
        args_schema: type[BaseModel] = Order

        def _run(self, sku: str, token: str) -> str:
            return sku

    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        with pytest.raises(EffectLedgerValidationError, match=r"default_factory \(\['token'\]\)"):
            wrap_crewai_tool(ledger, Place(), "shop.place")
        assert "shop.place" not in ledger.tools
    finally:
        ledger.close_sync()


# CrewAI warns about its own deprecated settings while a crew runs.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_crew_with_a_scripted_model_charges_once_across_two_kickoffs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``Crew`` (one ``Agent``, one ``Task``) over a scripted LLM that asks for
    the same charge: kicked off twice in one workflow (a restart), the order is
    charged once, and the second kickoff is answered from the receipt."""
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM

    # Offline: no telemetry or tracing calls home.
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("CREWAI_TRACING_ENABLED", "false")
    asked: list[int] = []

    class Scripted(BaseLLM):  # type: ignore[misc]
        """Asks for the charge once per kickoff, then gives its final answer."""

        def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            asked.append(1)
            if len(asked) % 2 == 1:
                return (
                    "Thought: charge it\nAction: payments_charge\n"
                    'Action Input: {"order_id": "o9", "amount": 5}'
                )
            return "Thought: done\nFinal Answer: charged o9"

        def supports_function_calling(self) -> bool:
            return False

        def supports_stop_words(self) -> bool:
            return False

        def get_context_window_size(self) -> int:
            return 100_000

    ledger = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    charges: list[str] = []
    try:

        @ledger.tool("payments.charge", idempotency_keys=["order_id"])
        def charge(order_id: str, amount: int) -> dict[str, Any]:
            """Charge an order."""
            charges.append(order_id)
            return {"charged": order_id, "amount": amount}

        crew_tool = as_crewai_tool(charge)
        outputs = []
        for _ in range(2):
            agent = Agent(
                role="clerk",
                goal="charge orders",
                backstory="a careful clerk",
                llm=Scripted(model="scripted"),
                tools=[crew_tool],
            )
            task = Task(description="Charge order o9 for 5.", expected_output="a note", agent=agent)
            with ledger.workflow("crew-kickoff"):
                outputs.append(str(Crew(agents=[agent], tasks=[task]).kickoff()))
        with ledger.workflow("crew-kickoff"):
            key = ledger.idem_key(charge.tool_call(order_id="o9", amount=5))
        effect = ledger.call_sync(ledger.find_by_idem_key, key)
    finally:
        ledger.close_sync()
    assert outputs == ["charged o9", "charged o9"]
    assert charges == ["o9"]
    assert len(asked) == 4
    assert effect is not None and effect.executions == 1 and effect.dedup_count == 1
