"""``agent-ledger import-0.2`` against a table written by the real agent-ledger 0.2.1."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, ToolCall
from agent_ledger.calls import ResourceDescriptor
from agent_ledger.cli import main
from agent_ledger.errors import EffectDeniedError, EffectFailedError, EffectTimeoutError
from agent_ledger.legacy.keys import legacy_key_of
from agent_ledger.options import ConcurrencyOptions, RunOptions
from agent_ledger.status import EffectStatus
from agent_ledger.stores.url import open_store
from tests.harness import DSN
from tests.legacy.conftest import V021, new_schema


def tool_call(spec: dict[str, Any]) -> ToolCall:
    resource = spec.get("resource")
    return ToolCall(
        spec["workflow_id"],
        spec["tool"],
        spec.get("args", {}),
        resource=ResourceDescriptor(**resource) if resource else None,
        idempotency_keys=spec.get("idempotency_keys"),
    )


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), stdout=out)
    return code, out.getvalue()


def age_sqlite_holders_folder(target: str, seconds: int) -> None:
    """Age the SQLite target's holders folder (its ``.born`` marker) by ``seconds``.

    A SqliteStore treats a holders folder born less than a lease ago as a sign of
    life for every holder in it (agent_ledger/stores/_sqlite_holders.py), and
    ``init`` has just made this one; like the aged heartbeat, this back door
    says the database was set up long before the 0.2.1 worker fell silent.
    """
    marker = Path(os.path.realpath(target[len("sqlite:///") :]) + "-holders") / ".born"
    assert marker.exists(), marker
    born = marker.stat().st_mtime_ns - seconds * 1_000_000_000
    os.utime(marker, ns=(born, born))


def import_json(source: str, target: str, *extra: str) -> dict[str, Any]:
    code, text = cli("--url", target, "import-0.2", "--from", source, "--json", *extra)
    assert code == 0, text
    report: dict[str, Any] = json.loads(text)
    return report


@pytest.fixture(params=["postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, schemas: list[str], tmp_path: Path) -> str:
    """An initialised, empty target store of each kind; its URL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = f"{DSN}?schema={new_schema(schemas, 'target')}"
    assert cli("--url", url, "init")[0] == 0
    return url


def rows(url: str) -> list[tuple[Any, ...]]:
    """Every stored effect, straight from the table (not through a store)."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            return sorted(conn.execute("SELECT * FROM agent_ledger_effects").fetchall())
    schema = url.rsplit("schema=", 1)[1]
    with psycopg.connect(DSN) as conn:
        found = conn.execute(f'SELECT *, result::text FROM "{schema}".agent_ledger_effects')
        return sorted(found.fetchall(), key=lambda row: str(row[0]))


def test_our_key_function_is_0_2_1s(scenario: list[dict[str, Any]], v021: V021) -> None:
    for entry in scenario:
        assert legacy_key_of(tool_call(entry["call"])) == entry["key021"]
    odd = [
        {
            "workflow_id": "w",
            "tool": "t",
            "args": {"é": 1e21, "\uffff": -0.0, "😀": [1e-7, 2**53 - 1]},
        },
        {"workflow_id": "w|x", "tool": "t", "args": {"s": 'q"\\\n\x01\u2028'}},
        {
            "workflow_id": "w",
            "tool": "t",
            "args": {"a": 1},
            "resource": {"namespace": "n/s", "type": "t", "id": {"b": [0.1, None, True]}},
        },
        {"workflow_id": "w", "tool": "t", "args": {"a": 1, "b": 2.0}, "idempotency_keys": ["b"]},
    ]
    assert [legacy_key_of(tool_call(spec)) for spec in odd] == v021.call("key", odd)


def test_every_imported_call_replays_its_receipt(
    scenario: list[dict[str, Any]], v021: V021, target: str
) -> None:
    report = import_json(v021.url, target)
    assert report["read"] == 11
    assert report["imported"] == 11
    assert report["skipped"] == 0
    assert report["unreadable"] == []
    assert report["by_status"] == {
        "denied": 1,
        "failed": 1,
        "processing": 1,
        "ready": 1,
        "requires_approval": 1,
        "succeeded": 6,
    }
    # The pair that collided under 0.2.1's key is reported, by both its names.
    [collision] = report["collisions"]
    assert "'team'" in collision and "'ops|notify'" in collision and "'team|ops'" in collision

    ran: list[str] = []

    def handler_for(name: str) -> Any:
        def handler(effect: object) -> str:
            ran.append(name)
            return "ran " + name

        return handler

    async def check() -> None:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        quick = RunOptions(concurrency=ConcurrencyOptions(wait_timeout_ms=200))
        try:
            for entry in scenario:
                call = tool_call(entry["call"])
                status = entry.get("status")
                if status == "succeeded":
                    result = await ledger.run(call, handler_for(call.tool))
                    # Exactly what 0.2.1 recorded, floats bit for bit.
                    assert result == entry["result"]
                    assert json.dumps(result, sort_keys=True) == json.dumps(
                        entry["result"], sort_keys=True
                    )
                elif status == "failed":
                    with pytest.raises(EffectFailedError) as failed:
                        await ledger.run(call, handler_for(call.tool))
                    assert (failed.value.message, failed.value.code) == tuple(entry["error"])
                elif status == "denied":
                    with pytest.raises(EffectDeniedError) as denied:
                        await ledger.run(call, handler_for(call.tool))
                    assert denied.value.reason == "too risky"
                elif status == "requires_approval":
                    effect = await ledger.find_by_idem_key(ledger.idem_key(call))
                    assert effect is not None
                    assert effect.status is EffectStatus.REQUIRES_APPROVAL
                    assert await ledger.approve(effect.idem_key, by="ops")
                    assert await ledger.run(call, handler_for(call.tool)) == "ran archive_repo"
                elif status == "ready":
                    assert await ledger.run(call, handler_for(call.tool)) == "ran rename_repo"
                elif status == "processing":
                    # Held by a 0.2.1 worker a moment ago: not taken over before its lease.
                    with pytest.raises(EffectTimeoutError):
                        await ledger.run(call, handler_for(call.tool), quick)
            assert ran == ["archive_repo", "rename_repo"]
            # The second call of the colliding pair never ran under 0.2.1 (it got
            # the first one's receipt); here it is its own call, and runs once.
            collider = next(tool_call(e["call"]) for e in scenario if "collider_of" in e)
            assert await ledger.run(collider, handler_for("collider")) == "ran collider"
            team_ops = tool_call(scenario[4]["call"])
            assert await ledger.run(team_ops, handler_for("x")) == {"sent": 1}
            assert ran == ["archive_repo", "rename_repo", "collider"]
        finally:
            await store.close()

    asyncio.run(check())


def test_processing_is_claimable_once_its_lease_has_passed(
    scenario: list[dict[str, Any]], v021: V021, target: str
) -> None:
    import_json(v021.url, target)
    stuck = tool_call(next(e["call"] for e in scenario if e.get("status") == "processing"))
    # Age the 0.2.1 row's last sign of life past the lease (a back door: SQL).
    if target.startswith("sqlite:///"):
        with sqlite3.connect(target[len("sqlite:///") :]) as conn:
            conn.execute("UPDATE agent_ledger_effects SET heartbeat_us = heartbeat_us - 60000000")
        age_sqlite_holders_folder(target, 60)
    else:
        schema = target.rsplit("schema=", 1)[1]
        with psycopg.connect(DSN) as pg:
            pg.execute(
                f'UPDATE "{schema}".agent_ledger_effects '
                "SET heartbeat_at = heartbeat_at - interval '60 seconds'"
            )

    async def check() -> None:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        runs: list[int] = []

        def handler(effect: object) -> str:
            runs.append(1)
            return "done" if len(runs) == 1 else "again"

        try:
            assert await ledger.run(stuck, handler) == "done"
            assert await ledger.run(stuck, handler) == "done"
            assert runs == [1]
        finally:
            await store.close()

    asyncio.run(check())


def test_a_second_import_changes_nothing(
    scenario: list[dict[str, Any]], v021: V021, target: str
) -> None:
    first = import_json(v021.url, target)
    before = rows(target)
    second = import_json(v021.url, target)
    assert (second["imported"], second["skipped"]) == (0, first["imported"])
    assert rows(target) == before
    assert len(before) == 11


def test_dry_run_writes_nothing(scenario: list[dict[str, Any]], v021: V021, target: str) -> None:
    code, text = cli("--url", target, "import-0.2", "--from", v021.url, "--dry-run")
    assert code == 0
    assert "would import 11, skipped 0 (already imported), collisions 1" in text
    assert "dry run: nothing written" in text
    assert rows(target) == []


def test_a_failure_mid_import_leaves_the_target_unchanged(
    scenario: list[dict[str, Any]], v021: V021, target: str
) -> None:
    # A real failure inside the target database, on one row in the middle.
    if target.startswith("sqlite:///"):
        with sqlite3.connect(target[len("sqlite:///") :]) as conn:
            conn.execute(
                "CREATE TRIGGER boom BEFORE INSERT ON agent_ledger_effects "
                "WHEN NEW.workflow_id = 'wf-2' BEGIN SELECT RAISE(ABORT, 'boom'); END"
            )
    else:
        schema = target.rsplit("schema=", 1)[1]
        with psycopg.connect(DSN) as conn:
            conn.execute(
                f'CREATE FUNCTION "{schema}".boom() RETURNS trigger LANGUAGE plpgsql AS '
                "$$ BEGIN IF NEW.workflow_id = 'wf-2' THEN RAISE EXCEPTION 'boom'; END IF; "
                "RETURN NEW; END $$"
            )
            conn.execute(
                f'CREATE TRIGGER boom BEFORE INSERT ON "{schema}".agent_ledger_effects '
                f'FOR EACH ROW EXECUTE FUNCTION "{schema}".boom()'
            )
    code, text = cli("--url", target, "import-0.2", "--from", v021.url)
    assert code == 1
    assert text == ""
    assert rows(target) == []


def test_bad_input_is_one_line_on_stderr(
    v021: V021, target: str, schemas: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A table named effects that is not 0.2.x's (psycopg's error has a caret
    # line), and a closed port (libpq adds "Is the server running...?").
    foreign = new_schema(schemas, "foreign")
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            f'CREATE SCHEMA "{foreign}"; CREATE TABLE "{foreign}".effects '
            "(idem_key text, args_canonical text, resource_id_canonical int)"
        )
    closed = urlunsplit(urlsplit(DSN)._replace(netloc="postgres@127.0.0.1:1"))
    for source, expected, exit_code in (
        ("sqlite:///x.db", "--from must be a postgresql:// URL", 2),
        (v021.url, "no agent-ledger 0.2.x table", 2),  # the schema has no table yet
        (f"{DSN}?schema={foreign}", 'column "id" does not exist', 1),
        (closed, "Connection refused", 1),
    ):
        code, text = cli("--url", target, "import-0.2", "--from", source)
        err = capsys.readouterr().err
        assert code == exit_code, err
        assert text == ""
        assert err.startswith("agent-ledger: ") and expected in err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "LINE 1" not in err and "Is the server running" not in err
    assert rows(target) == []


def test_the_migration_guides_procedure_runs_verbatim(
    scenario: list[dict[str, Any]], v021: V021, tmp_path: Path
) -> None:
    page = (Path(__file__).parents[2] / "docs" / "migrating-from-0.2.md").read_text()
    section = page.split("## The import", 1)[1]
    script = section.split("```bash\n", 1)[1].split("```", 1)[0]
    url = f"sqlite:///{tmp_path / 'new.db'}"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ["PATH"],
        "OLD_LEDGER_URL": v021.url,
        "AGENT_LEDGER_URL": url,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "would import 11" in done.stdout and "imported 11" in done.stdout
    second = json.loads((tmp_path / "second-run.json").read_text())
    assert (second["imported"], second["skipped"]) == (0, 11)
    assert "11 effects" in done.stdout  # agent-ledger stats
    assert len(rows(url)) == 11


def test_results_beyond_64_bit_integers_are_imported_and_reported(v021: V021, target: str) -> None:
    """0.2.1 replays any integer exactly (and a float jsonb stored as an integer
    literal, 1e20, as that integer); here orjson decodes integers up to 64 bits,
    so such a result replays as the nearest float. Imported anyway (never run
    again), listed in the report; a number beyond float range is not importable."""
    big = 12345678901234567890123
    calls = {
        "big": {"n": big, "ok": 2**63 - 1},
        "jsonb_float": [1e20, 0.1],
        "exact": {"u64": 2**64 - 1, "i64": -(2**63), "f": 1e16, "s": "1" * 30},
        "huge": {"n": 10**400},
    }
    steps: list[dict[str, Any]] = [{"op": "init"}]
    for name, result in calls.items():
        steps.append({"op": "run", "call": {"workflow_id": "wf", "tool": name}, "result": result})
    v021.call("ops", steps)
    ids = dict(_ids(v021.schema))

    report = import_json(v021.url, target)
    assert report["imported"] == 3
    assert sorted(report["inexact_results"]) == sorted([ids["big"], ids["jsonb_float"]])
    [unreadable] = report["unreadable"]
    assert ids["huge"] in unreadable and "its result cannot be read here" in unreadable
    code, text = cli("--url", target, "import-0.2", "--from", v021.url)
    assert code == 0
    assert "inexact results 2" in text
    assert f"inexact result: effect {ids['big']} replays an integer beyond 64 bits" in text

    async def replay() -> dict[str, Any]:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        try:
            return {
                name: await ledger.run(ToolCall("wf", name, {}), lambda effect: "ran again")
                for name in ("big", "jsonb_float", "exact")
            }
        finally:
            await store.close()

    got = asyncio.run(replay())
    # What the migration guide says a replay gives.
    assert got["big"] == {"n": float(big), "ok": 2**63 - 1}
    assert type(got["big"]["n"]) is float
    assert got["jsonb_float"] == [1e20, 0.1] and type(got["jsonb_float"][0]) is float
    assert got["exact"] == calls["exact"]
    assert type(got["exact"]["f"]) is int  # jsonb's 10000000000000000, as 0.2.1 replays it


def _ids(schema: str) -> list[tuple[str, str]]:
    with psycopg.connect(DSN) as conn:
        found = conn.execute(f'SELECT tool, id::text FROM "{schema}".effects')
        return [(str(tool), str(effect_id)) for tool, effect_id in found.fetchall()]


def _spec(tool: str) -> dict[str, Any]:
    return {"workflow_id": "wf-re", "tool": tool, "args": {"n": 1}}


def _call(tool: str) -> ToolCall:
    return ToolCall("wf-re", tool, {"n": 1})


def test_a_re_import_brings_rows_0_2_finished_since_up_to_date(v021: V021, target: str) -> None:
    """The guide: re-run the import while old workers still run. A row still as
    the first import left it follows what 0.2.1 did since (the adversary's case:
    processing, then finished in 0.2.1, must not run again here)."""
    v021.call(
        "ops",
        [
            {"op": "init"},
            {"op": "begin", "call": _spec("pay")},
            {"op": "begin", "call": _spec("refund")},
            *(
                step
                for tool in ("approve_me", "deny_me", "approve_and_run")
                for step in (
                    {"op": "begin", "call": _spec(tool)},
                    {"op": "request_approval", "call": _spec(tool)},
                )
            ),
            {"op": "run", "call": _spec("done"), "result": "done before"},
        ],
    )
    first = import_json(v021.url, target)
    assert first["imported"] == 6
    v021.call(
        "ops",
        [
            {"op": "succeed", "call": _spec("pay"), "result": {"charged": 10}},
            {"op": "fail", "call": _spec("refund"), "error": ["card expired", "E42"]},
            {"op": "approve", "call": _spec("approve_me")},
            {"op": "deny", "call": _spec("deny_me"), "reason": "too risky"},
            {"op": "approve", "call": _spec("approve_and_run")},
            {"op": "run", "call": _spec("approve_and_run"), "result": "ran in 0.2.1"},
        ],
    )
    before = rows(target)
    code, text = cli("--url", target, "import-0.2", "--from", v021.url, "--dry-run")
    assert code == 0 and "would update 5, conflicts 0" in text, text
    assert "would update: row " in text and "processing -> succeeded" in text
    assert rows(target) == before

    second = import_json(v021.url, target)
    assert (second["imported"], second["skipped"], second["conflicts"]) == (0, 1, [])
    changes = sorted(line.split(": ", 1)[1] for line in second["updated"])
    assert changes == [
        "processing -> failed",
        "processing -> succeeded",
        "requires_approval -> denied",
        "requires_approval -> ready",
        "requires_approval -> succeeded",
    ]
    after = rows(target)
    # Idempotent: a third run changes nothing.
    third = import_json(v021.url, target)
    assert (third["imported"], third["updated"], third["skipped"]) == (0, [], 6)
    assert rows(target) == after

    ran: list[str] = []

    def handler(effect: Any) -> object:
        ran.append(effect.tool)
        return "ran here"

    async def check() -> None:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        try:
            assert await ledger.run(_call("pay"), handler) == {"charged": 10}
            assert await ledger.run(_call("approve_and_run"), handler) == "ran in 0.2.1"
            assert await ledger.run(_call("done"), handler) == "done before"
            with pytest.raises(EffectFailedError) as failed:
                await ledger.run(_call("refund"), handler)
            assert (failed.value.message, failed.value.code) == ("card expired", "E42")
            with pytest.raises(EffectDeniedError) as denied:
                await ledger.run(_call("deny_me"), handler)
            assert denied.value.reason == "too risky"
            # Approved in 0.2.1 and not run there: it runs on its next call, once.
            assert await ledger.run(_call("approve_me"), handler) == "ran here"
            assert await ledger.run(_call("approve_me"), handler) == "ran here"
            assert ran == ["approve_me"]
        finally:
            await store.close()

    asyncio.run(check())


def test_a_re_import_never_overwrites_what_this_ledger_changed(v021: V021, target: str) -> None:
    """Changed on both sides since the first import: reported, the target's kept."""
    v021.call(
        "ops",
        [
            {"op": "init"},
            {"op": "begin", "call": _spec("taken_over")},
            {"op": "begin", "call": _spec("taken_over_only_here")},
            {"op": "begin", "call": _spec("decided_twice")},
            {"op": "request_approval", "call": _spec("decided_twice")},
            {"op": "begin", "call": _spec("approved_here")},
            {"op": "request_approval", "call": _spec("approved_here")},
        ],
    )
    import_json(v021.url, target)
    # This ledger takes two over (their 0.2.1 worker looks dead: a back door
    # ages the heartbeat) and runs them, and decides two approvals.
    ids = dict(_ids(v021.schema))
    stale = [ids["taken_over"], ids["taken_over_only_here"]]
    if target.startswith("sqlite:///"):
        with sqlite3.connect(target[len("sqlite:///") :]) as conn:
            conn.execute(
                "UPDATE agent_ledger_effects SET heartbeat_us = heartbeat_us - 60000000 "
                "WHERE id IN (?, ?)",
                stale,
            )
        age_sqlite_holders_folder(target, 60)
    else:
        schema = target.rsplit("schema=", 1)[1]
        with psycopg.connect(DSN) as pg:
            pg.execute(
                f'UPDATE "{schema}".agent_ledger_effects '
                "SET heartbeat_at = heartbeat_at - interval '60 seconds' WHERE id::text = ANY(%s)",
                (stale,),
            )

    async def here() -> None:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        try:
            for tool in ("taken_over", "taken_over_only_here"):
                assert await ledger.run(_call(tool), lambda effect: "ran here") == "ran here"
            assert await ledger.approve(ledger.idem_key(_call("decided_twice")), by="ops")
            assert await ledger.approve(ledger.idem_key(_call("approved_here")), by="ops")
        finally:
            await store.close()

    asyncio.run(here())
    v021.call(
        "ops",
        [
            {"op": "succeed", "call": _spec("taken_over"), "result": "ran in 0.2.1"},
            {"op": "deny", "call": _spec("decided_twice"), "reason": "no"},
        ],
    )
    before = rows(target)
    report = import_json(v021.url, target)
    assert (report["imported"], report["updated"], report["skipped"]) == (0, [], 2)
    conflicts = sorted(report["conflicts"])
    assert len(conflicts) == 2, conflicts
    [both_ran] = [c for c in conflicts if ids["taken_over"] in c]
    assert "ran on both sides" in both_ran
    assert "0.2.x has it succeeded, this ledger succeeded" in both_ran
    [decided] = [c for c in conflicts if ids["decided_twice"] in c]
    assert (
        "changed on both sides" in decided and "0.2.x has it denied, this ledger ready" in decided
    )
    assert rows(target) == before

    async def replay() -> None:
        store = await open_store(target, create=False)
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        try:
            assert await ledger.run(_call("taken_over"), lambda effect: "again") == "ran here"
        finally:
            await store.close()

    asyncio.run(replay())
