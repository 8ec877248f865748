"""``ledger.replay()``: a recorded agent run re-run from its store or its export, on every store.

The recorded run has several tools (async and sync), a tool calling another
tool, calls made in parallel, a plain ``ledger.run()``, a failure and a
denial. Its replay must give the same outputs with no handler called, and
leave the recording exactly as it was: the export file byte for byte, the
source store row for row (read through the harness's back door, duplicate
counts included).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_ledger import (
    Effect,
    EffectDeniedError,
    EffectError,
    EffectFailedError,
    EffectLedger,
    EffectLedgerError,
    EffectLedgerOptions,
    EffectLedgerValidationError,
    EffectStatus,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.cli import main as cli_main
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectPayloadMismatchError,
    UnrecordedEffectError,
)
from agent_ledger.ledger import RECORDING
from agent_ledger.legacy.keys import legacy_key_of
from agent_ledger.receipt import effect_to_record
from agent_ledger.sagas import SagaFailed
from agent_ledger.stores.saga_base import SagaStatus
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool, current_workflow
from tests.harness import (
    DSN,
    TEST_SCHEMA,
    MemoryHarness,
    MySQLHarness,
    PostgresHarness,
    StoreHarness,
    mysql_test_url,
)

WORKFLOW = "order-7"


class Declined(Exception):
    code = "card_declined"


@dataclass
class Agent:
    """The tools of a small shopping agent on ``ledger``; ``runs`` is every handler call."""

    ledger: EffectLedger
    runs: list[str] = field(default_factory=list)
    tools: dict[str, Tool[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ledger, runs = self.ledger, self.runs

        @ledger.tool("catalog.search")
        async def search(query: str, limit: int = 2) -> list[str]:
            runs.append(f"search {query}")
            return [f"{query}-{i}" for i in range(limit)]

        @ledger.tool("web.fetch")
        def fetch(url: str) -> dict[str, str]:  # a sync tool: runs in a worker thread
            runs.append(f"fetch {url}")
            return {"url": url, "body": f"<p>{url}</p>"}

        @ledger.tool("notes.summarize")
        async def summarize(url: str) -> str:
            runs.append(f"summarize {url}")
            page = await fetch(url + "?full")  # a tool calling a tool
            return page["body"].upper()

        @ledger.tool("payments.charge")
        async def charge(order_id: str, cents: int) -> str:
            runs.append(f"charge {cents}")
            raise Declined(f"card declined for {cents} cents")

        @ledger.tool(
            "mail.send",
            requires_approval=True,
            run_options=RunOptions(wait_for_approval=False),
        )
        async def send(to: str, body: str) -> str:
            runs.append(f"send {to}")
            return "sent"

        self.tools.update(ledger.tools)

    def note(self, text: str) -> ToolCall:
        return ToolCall(workflow_id=WORKFLOW, tool="audit.note", args={"text": text})

    async def _note_handler(self, effect: Effect) -> dict[str, object]:
        self.runs.append("note")
        return {"noted": effect.args["text"]}

    async def run(self) -> list[object]:
        """The agent's run: what each step gave, a raised error as (type, code, message)."""
        t = self.tools
        out: list[object] = []

        async def step(awaitable: Any) -> None:
            try:
                out.append(await awaitable)
            except (EffectLedgerError, Declined) as exc:
                out.append([type(exc).__name__, getattr(exc, "code", None), str(exc)])

        hits = await t["catalog.search"]("lamp")
        out.append(hits)
        await step(asyncio.gather(*(t["web.fetch"](url) for url in hits)))  # in parallel
        await step(t["notes.summarize"](hits[1]))
        await step(self.ledger.run(self.note("looked at lamps"), self._note_handler))
        await step(t["payments.charge"]("o-7", 2_000))
        await step(t["mail.send"]("ann@example.com", body="your lamp"))
        return out


async def record(ledger: EffectLedger) -> tuple[Agent, list[object]]:
    """Run the agent, deny its mail, and run it again: the recorded outcomes."""
    agent = Agent(ledger)
    async with ledger.workflow(WORKFLOW):
        first = await agent.run()
        assert first[-1][0] == "ApprovalPendingError"  # type: ignore[index]
        (pending,) = await ledger.pending_approvals()
        assert await ledger.deny(pending.idem_key, reason="not now", by="ops")
        second = await agent.run()
    return agent, second


async def export(harness: StoreHarness, path: Path) -> None:
    """``agent-ledger export --workflow order-7 --format jsonl``: the real command where
    the store has a URL; for MemoryStore (no URL) the same records, written the same way."""
    await harness.store.flush_counts()
    if harness.kind == "memory":
        page = await harness.ledger().list_effects(workflow_id=WORKFLOW, limit=1_000)
        path.write_bytes(b"".join(orjson.dumps(effect_to_record(e)) + b"\n" for e in page.effects))
        return
    if harness.kind == "postgres":
        url = f"{DSN}?schema={TEST_SCHEMA}"
    elif harness.kind == "mysql":
        url = mysql_test_url()
    else:
        url = f"sqlite:///{harness.store.path}"  # type: ignore[attr-defined]
    argv = ["--url", url, "export", "--workflow", WORKFLOW, "--format", "jsonl", "-o", str(path)]
    assert await asyncio.to_thread(cli_main, argv) == 0


async def stored_rows(harness: StoreHarness) -> object:
    """Everything the store holds, read past its API (after writing its pending counts)."""
    await harness.store.flush_counts()
    if isinstance(harness, MemoryHarness):
        store = harness.store
        rows = {
            key: {slot: getattr(row, slot) for slot in type(row).__slots__}
            for key, row in store._rows.items()
        }
        return copy.deepcopy([rows, store._saga_rows, store._step_rows])
    tables = ["agent_ledger_effects", "agent_ledger_sagas", "agent_ledger_saga_steps"]
    if isinstance(harness, PostgresHarness):
        from psycopg import sql

        found = []
        for table in tables:
            cursor = await harness.backdoor.execute(
                sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier(TEST_SCHEMA, table))
            )
            found.append(await cursor.fetchall())
        return found
    if isinstance(harness, MySQLHarness):
        found = []
        for table in tables:
            async with harness.backdoor.cursor() as cur:
                await cur.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
                found.append(await cur.fetchall())
        return found
    path = harness.store.path  # type: ignore[attr-defined]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables]


def replayer() -> Agent:
    """The same agent on a ledger of its own: the replay's."""
    return Agent(build_ledger(MemoryStore()))


# -- a whole run ----------------------------------------------------------------------


async def test_a_strict_replay_from_the_store_gives_the_recorded_outputs_running_nothing(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    original, recorded = await record(ledger)
    assert recorded[4][:2] == ["EffectFailedError", "card_declined"]  # type: ignore[index]
    assert recorded[5][0] == "EffectDeniedError"  # type: ignore[index]
    before = await stored_rows(harness)
    runs_before = list(original.runs)

    agent = replayer()
    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        replayed = await agent.run()

    assert replayed == recorded
    assert agent.runs == [] and original.runs == runs_before
    assert await stored_rows(harness) == before
    own = agent.ledger.store
    assert isinstance(own, MemoryStore) and len(own) == 0  # nothing stored by the replay


async def test_a_strict_replay_from_the_export_file_leaves_it_byte_identical(
    harness: StoreHarness, tmp_path: Path
) -> None:
    ledger = harness.ledger()
    _, recorded = await record(ledger)
    path = tmp_path / "order-7.jsonl"
    await export(harness, path)
    exported = path.read_bytes()
    before = await stored_rows(harness)

    agent = replayer()
    with agent.ledger.replay(WORKFLOW, source=path):  # a plain `with` works too
        replayed = await agent.run()
        again = await agent.run()  # every call answers again, from the same recording

    assert replayed == recorded and again == recorded
    assert agent.runs == []
    assert path.read_bytes() == exported
    assert await stored_rows(harness) == before


async def test_calls_match_by_key_in_any_order(harness: StoreHarness, tmp_path: Path) -> None:
    """Reversed, interleaved and nested calls each find their own recorded outcome."""
    ledger = harness.ledger()
    await record(ledger)
    path = tmp_path / "run.jsonl"
    await export(harness, path)
    agent = replayer()
    t = agent.tools
    async with agent.ledger.replay(WORKFLOW, source=path):
        pages = await asyncio.gather(
            t["web.fetch"]("lamp-1?full"),  # made inside summarize() when recorded
            t["web.fetch"]("lamp-1"),
            t["web.fetch"]("lamp-0"),
        )
        hits = await t["catalog.search"](query="lamp", limit=2)  # keywords, defaults
        begun = await agent.ledger.begin(agent.note("looked at lamps"))
    assert [p["url"] for p in pages] == ["lamp-1?full", "lamp-1", "lamp-0"]
    assert hits == ["lamp-0", "lamp-1"]
    assert begun.cached and begun.cached_result == {"noted": "looked at lamps"}
    assert begun.effect.status is EffectStatus.SUCCEEDED
    assert agent.runs == []


async def test_a_replayed_result_is_the_callers_own_copy(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        hits = await agent.tools["catalog.search"]("lamp")
        hits.append("changed")
        assert await agent.tools["catalog.search"]("lamp") == ["lamp-0", "lamp-1"]


# -- calls the recording cannot answer ------------------------------------------------


async def test_changed_args_raise_before_any_handler_naming_the_arg(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        with pytest.raises(UnrecordedEffectError) as raised:
            await agent.tools["payments.charge"]("o-7", 1_500)
    error = raised.value
    assert error.tool == "payments.charge" and error.differing == ("cents",)
    assert error.recorded_status is None and error.workflow_id == WORKFLOW
    assert "'payments.charge'" in str(error)
    assert "cents: 1500 now, 2000 recorded" in str(error)
    assert agent.runs == []
    assert len(agent.ledger.store) == 0  # type: ignore[arg-type]


async def test_a_new_tool_raises_saying_none_of_it_was_recorded(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    ran: list[str] = []

    @agent.ledger.tool("crm.update")
    async def update(customer: str) -> None:
        ran.append(customer)

    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        with pytest.raises(UnrecordedEffectError, match="no call of that tool was recorded"):
            await update("ann")
        with pytest.raises(UnrecordedEffectError, match=r"'audit\.note'"):
            await agent.ledger.run(agent.note("another note"), lambda e: ran.append("note"))
    assert ran == []


async def test_a_recorded_failure_and_denial_replay_as_they_did(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        with pytest.raises(EffectFailedError) as failed:
            await agent.tools["payments.charge"](order_id="o-7", cents=2_000)
        with pytest.raises(EffectDeniedError) as denied:
            await agent.tools["mail.send"]("ann@example.com", "your lamp")
    assert failed.value.code == "card_declined"
    assert failed.value.message == "card declined for 2000 cents"
    assert denied.value.reason == "not now" and denied.value.status is EffectStatus.DENIED
    assert agent.runs == []


async def test_non_strict_runs_an_unrecorded_call_on_its_own_store_and_logs_it(
    harness: StoreHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A new call runs, here: its nested calls that were recorded are still answered."""
    ledger = harness.ledger()
    await record(ledger)
    before = await stored_rows(harness)
    agent = replayer()
    t = agent.tools
    caplog.set_level(logging.WARNING, logger="agent_ledger")
    async with agent.ledger.replay(WORKFLOW, source=harness.store, strict=False):
        # summarize("lamp-0") was never recorded; the fetch it makes inside was not
        # either, but fetch("lamp-1?full") (summarize's of lamp-1) was.
        summary = await t["notes.summarize"]("lamp-0")
        assert await t["web.fetch"]("lamp-1?full") == {
            "url": "lamp-1?full",
            "body": "<p>lamp-1?full</p>",
        }
        assert await t["catalog.search"]("lamp") == ["lamp-0", "lamp-1"]
    assert summary == "<P>LAMP-0?FULL</P>"
    assert agent.runs == ["summarize lamp-0", "fetch lamp-0?full"]
    logged = [r.getMessage() for r in caplog.records if r.name == "agent_ledger"]
    assert any("'notes.summarize'" in m and "runs on the ledger's own store" in m for m in logged)
    own = await agent.ledger.list_effects()
    assert sorted(e.tool for e in own.effects) == ["notes.summarize", "web.fetch"]
    assert await stored_rows(harness) == before


async def test_a_recorded_call_that_had_not_finished_has_no_outcome_to_replay(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    agent = Agent(ledger)
    async with ledger.workflow(WORKFLOW):
        with pytest.raises(ApprovalPendingError):
            await agent.tools["mail.send"]("bob@example.com", "hi")
    replaying = replayer()
    async with replaying.ledger.replay(WORKFLOW, source=harness.store):
        with pytest.raises(UnrecordedEffectError, match="requires_approval") as raised:
            await replaying.tools["mail.send"]("bob@example.com", "hi")
    assert raised.value.recorded_status is EffectStatus.REQUIRES_APPROVAL
    assert replaying.runs == []


async def test_a_call_of_another_workflow_inside_the_replay_is_refused(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    async with (
        agent.ledger.replay(WORKFLOW, source=harness.store),
        agent.ledger.workflow("order-8"),
    ):
        with pytest.raises(UnrecordedEffectError, match="'order-8'"):
            await agent.tools["catalog.search"]("lamp")
    assert agent.runs == []


async def test_another_ledgers_calls_are_not_replayed(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    other = replayer()
    async with agent.ledger.replay(WORKFLOW, source=harness.store):
        assert await other.tools["catalog.search"]("lamp") == ["lamp-0", "lamp-1"]
    assert other.runs == ["search lamp"]


async def test_validated_args_are_checked_against_the_recording(harness: StoreHarness) -> None:
    """Keyed on the order, validated on the amount: a replay with another amount raises
    EffectPayloadMismatchError, as a normal replay would; another note replays."""
    ran: list[int] = []

    def refund_tool(ledger: EffectLedger) -> Tool[Any]:
        @ledger.tool("payments.refund", idempotency_keys=["order_id"], validate_keys=["cents"])
        async def refund(order_id: str, cents: int, note: str) -> str:
            ran.append(cents)
            return f"refunded {cents}"

        return refund

    ledger = harness.ledger()
    async with ledger.workflow(WORKFLOW):
        assert await refund_tool(ledger)("o-7", 500, "sorry") == "refunded 500"
    replaying = build_ledger(MemoryStore())
    refund = refund_tool(replaying)
    async with replaying.replay(WORKFLOW, source=harness.store):
        with pytest.raises(EffectPayloadMismatchError) as raised:
            await refund("o-7", 900, "sorry")
        assert await refund("o-7", 500, "another note") == "refunded 500"
    assert raised.value.fields == ("cents",)
    assert ran == [500]


async def test_a_call_answered_under_its_0_2_key_replays_with_legacy_keys(
    harness: StoreHarness,
) -> None:
    """With ``legacy_keys=True`` the recorded run's call was answered by an effect
    imported under its 0.2.x key (0.2.x could not tell 2 from 2.0): a replay
    from that store answers it the same way, with no handler run, strict or not."""
    imported = ToolCall(WORKFLOW, "img.resize", {"scale": 2})
    plain = harness.ledger()
    await plain.run(imported, lambda e: {"w": 640})
    store: Any = harness.store  # every store of this package records 0.2.x keys
    await store.record_legacy(legacy_key_of(imported), plain.idem_key(imported))
    recording = EffectLedger(EffectLedgerOptions(store=harness.store, legacy_keys=True))
    again = ToolCall(WORKFLOW, "img.resize", {"scale": 2.0})  # another key today
    assert await recording.run(again, lambda e: {"w": 0}) == {"w": 640}
    before = await stored_rows(harness)
    ran: list[int] = []

    def handler(effect: Effect) -> dict[str, int]:
        ran.append(1)
        return {"w": 0}

    for strict in (True, False):
        replaying = EffectLedger(EffectLedgerOptions(store=MemoryStore(), legacy_keys=True))
        async with replaying.replay(WORKFLOW, source=harness.store, strict=strict):
            assert await replaying.run(again, handler) == {"w": 640}
            began = await replaying.begin(again)
            assert began.cached and began.cached_result == {"w": 640}
        assert ran == []
        assert len(replaying.store) == 0  # type: ignore[arg-type]
    assert await stored_rows(harness) == before


# -- sagas ----------------------------------------------------------------------------


async def test_a_failed_saga_replays_its_steps_and_its_undo_from_the_recording(
    harness: StoreHarness,
) -> None:
    def shop(ledger: EffectLedger, log: list[str]) -> Mapping[str, Tool[Any]]:
        @ledger.tool("stock.reserve", compensate="stock.release")
        async def reserve(sku: str) -> str:
            log.append("reserve")
            return f"held {sku}"

        @ledger.tool("stock.release")
        async def release(forward: Effect) -> str:
            log.append("release")
            return f"released {forward.result}"

        @ledger.tool("payments.charge")
        async def charge(cents: int) -> None:
            log.append("charge")
            raise Declined("declined")

        return ledger.tools

    async def order(ledger: EffectLedger, tools: Mapping[str, Tool[Any]]) -> list[object]:
        """How the saga ended: everything its outcome says but times and owner."""
        with pytest.raises(SagaFailed) as failed:
            async with ledger.saga("order-9"):
                await tools["stock.reserve"]("A")
                await tools["payments.charge"](500)
        o = failed.value.outcome
        return [
            o.status.value,
            o.error,
            [(s.position, s.tool) for s in o.compensated],
            [(s.position, s.tool) for s in o.failed_compensations],
            [
                (
                    s.tool,
                    s.forward and (s.forward.status, s.forward.result, s.forward.error),
                    s.compensation and (s.compensation.status, s.compensation.result),
                )
                for s in o.steps
            ],
        ]

    log: list[str] = []
    ledger = harness.ledger()
    recorded = await order(ledger, shop(ledger, log))
    assert log == ["reserve", "charge", "release"]
    assert recorded[:3] == [
        "compensated",
        EffectError("declined", "card_declined"),  # the failed step's recorded error
        [(0, "stock.reserve")],
    ]
    before = await stored_rows(harness)

    # The replayed saga ends as the recorded one did: the same error (not the
    # replayed EffectFailedError's text), the same steps undone, each step's
    # effects the recorded ones.
    replay_log: list[str] = []
    replaying = build_ledger(MemoryStore())
    tools = shop(replaying, replay_log)
    async with replaying.replay("order-9", source=harness.store):
        assert await order(replaying, tools) == recorded
    assert replay_log == []
    own = replaying.store
    assert isinstance(own, MemoryStore) and len(own) == 0  # only the saga's own rows
    assert await stored_rows(harness) == before


async def test_a_strict_refusal_inside_a_saga_surfaces_and_leaves_nothing_for_a_person(
    harness: StoreHarness,
) -> None:
    """Replayed code that asks a saga step the recording cannot answer diverged
    from the recorded run: ``UnrecordedEffectError`` reaches the caller as it
    is (not a ``SagaCompensationFailed``), no handler runs (forward or undo:
    undoing recorded steps of a run the code no longer makes would need undos
    that were never recorded), and no saga waits for a person."""

    def shop(ledger: EffectLedger, log: list[str]) -> Mapping[str, Tool[Any]]:
        @ledger.tool("stock.charge", compensate="stock.refund")
        async def charge(order_id: str, cents: int) -> str:
            log.append("charge")
            return "ch"

        @ledger.tool("stock.refund")
        async def refund(forward: Effect) -> str:
            log.append("refund")
            return "refunded"

        @ledger.tool("stock.reserve", compensate="stock.release")
        async def reserve(sku: str) -> str:
            log.append("reserve")
            return f"held {sku}"

        @ledger.tool("stock.release")
        async def release(forward: Effect) -> str:
            log.append("release")
            return "released"

        return ledger.tools

    ledger = harness.ledger()
    tools = shop(ledger, [])
    async with ledger.saga("order-10"):
        await tools["stock.charge"]("o", 10)
        await tools["stock.reserve"]("A")

    replay_log: list[str] = []
    replaying = build_ledger(MemoryStore())
    tools = shop(replaying, replay_log)
    with pytest.raises(UnrecordedEffectError) as refused:
        async with (
            replaying.replay("order-10", source=harness.store),
            replaying.saga("order-10"),
        ):
            await tools["stock.charge"]("o", 10)
            await tools["stock.reserve"]("B")  # the code changed: another sku
    assert refused.value.tool == "stock.reserve" and refused.value.differing == ("sku",)
    assert replay_log == []
    own = replaying.store
    assert isinstance(own, MemoryStore)
    assert await own.list_sagas(statuses=frozenset({SagaStatus.COMPENSATION_FAILED})) == []
    assert len(own) == 0  # no effect of the replayed code was stored either
    recovery = await replaying.recover_sagas(lease_ms=100)
    assert recovery.finished == [] and recovery.abandoned == [] and replay_log == []


# -- blocks left out of order -----------------------------------------------------------


async def test_blocks_left_out_of_order_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """Leaving a replay (or a workflow() block) before one entered inside it would
    leave the inner one's recording and workflow set after both ended (each
    exit restores what was in place before it). It is refused with a clear
    error, nothing changes, and leaving in order then works."""
    store = MemoryStore()
    recorded = Agent(build_ledger(store))
    async with recorded.ledger.workflow(WORKFLOW):
        await recorded.tools["catalog.search"]("lamp")
    replaying = Agent(build_ledger(MemoryStore()))
    outer = replaying.ledger.replay(WORKFLOW, source=store)
    inner = replaying.ledger.replay(WORKFLOW, source=store)
    with outer:
        with inner:
            with pytest.raises(RuntimeError, match=r"exited before Replay\('order-7'"):
                outer.__exit__(None, None, None)
            assert RECORDING.get() is inner and current_workflow() == WORKFLOW
        assert RECORDING.get() is outer
    assert RECORDING.get() is None and current_workflow() is None

    # A workflow() block left open inside a replay: the replay's exit is refused.
    with outer:
        scope = replaying.ledger.workflow("other")
        scope.__enter__()
        with pytest.raises(RuntimeError, match=r"exited before WorkflowScope\('other'\)"):
            outer.__exit__(None, None, None)
        assert RECORDING.get() is outer and current_workflow() == "other"
        scope.__exit__(None, None, None)
        assert current_workflow() == WORKFLOW
    assert RECORDING.get() is None and current_workflow() is None

    # And two workflow() blocks.
    a, b = replaying.ledger.workflow("a"), replaying.ledger.workflow("b")
    with a:
        with b:
            with pytest.raises(RuntimeError, match="exited before"):
                a.__exit__(None, None, None)
            assert current_workflow() == "b"
        assert current_workflow() == "a"
    assert current_workflow() is None
    async with replaying.ledger.workflow(WORKFLOW):  # no replay left in force: runs for real
        assert await replaying.tools["catalog.search"]("lamp") == ["lamp-0", "lamp-1"]
    assert replaying.runs == ["search lamp"]


# -- bad input --------------------------------------------------------------------------


def _bad_source(ledger: EffectLedger, source: Any, match: str) -> None:
    with pytest.raises(EffectLedgerValidationError, match=match) as raised:
        ledger.replay(WORKFLOW, source=source)
    assert raised.value.field == "source"


async def test_bad_sources_raise_clear_errors_and_change_nothing(
    harness: StoreHarness, tmp_path: Path
) -> None:
    ledger = harness.ledger()
    await record(ledger)
    good = tmp_path / "good.jsonl"
    await export(harness, good)
    lines = good.read_bytes().splitlines(keepends=True)
    before = await stored_rows(harness)
    replaying = replayer()
    r = replaying.ledger

    _bad_source(r, tmp_path / "missing.jsonl", "no such file")
    _bad_source(r, tmp_path, "cannot be read")
    _bad_source(r, None, "got NoneType")
    _bad_source(r, 42, "got int")
    _bad_source(r, r.store, "this ledger's own store")
    _bad_source(r, MemoryStore, "is the class MemoryStore, not a store")

    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(lines[0] + b'{"id": "x", "idem_key": \n' + lines[1])
    _bad_source(r, broken, r"line 2 is not JSON")
    not_effect = tmp_path / "not-effect.jsonl"
    not_effect.write_bytes(lines[0] + b'{"hello": 1}\n')
    _bad_source(r, not_effect, r"line 2 is not an exported effect: it has no")
    a_list = tmp_path / "list.jsonl"
    a_list.write_bytes(b"[1, 2]\n")
    _bad_source(r, a_list, r"line 1 is a JSON list, not an exported effect")
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(lines[0] + lines[0])
    _bad_source(r, twice, "line 2: effect .* appears a second time")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    _bad_source(r, empty, "holds no effects")
    other = tmp_path / "other.jsonl"
    other.write_bytes(good.read_bytes())
    with pytest.raises(EffectLedgerValidationError, match="only of 'order-7'"):
        r.replay("order-8", source=other)
    with pytest.raises(EffectLedgerValidationError, match="holds no effects of workflow 'order-8'"):
        async with r.replay("order-8", source=harness.store):
            pass
    with pytest.raises(EffectLedgerValidationError, match="strict must be True or False"):
        r.replay(WORKFLOW, source=good, strict=None)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="workflow_id"):
        r.replay("", source=good)

    assert replaying.runs == [] and len(r.store) == 0  # type: ignore[arg-type]
    assert await stored_rows(harness) == before
    # A failed replay leaves no block open: calls run as usual afterwards.
    async with r.workflow(WORKFLOW):
        await replaying.tools["catalog.search"]("lamp")
    assert replaying.runs == ["search lamp"]


async def test_a_sync_with_on_a_store_source_reads_it_at_the_first_call(
    harness: StoreHarness,
) -> None:
    ledger = harness.ledger()
    await record(ledger)
    agent = replayer()
    with (
        agent.ledger.replay("order-8", source=harness.store),
        pytest.raises(EffectLedgerValidationError, match="no effects of workflow 'order-8'"),
    ):
        await agent.tools["catalog.search"]("lamp")
    assert agent.runs == []
