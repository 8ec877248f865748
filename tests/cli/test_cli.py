"""The agent-ledger command: every subcommand, exit codes, and errors as one line."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pytest

from agent_ledger import EffectStatus, RunOptions, ToolCall
from agent_ledger.cli import CSV_JSON_COLUMNS
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.receipt import RECORD_FIELDS, effect_from_record
from agent_ledger.stores.url import open_store
from agent_ledger.testing import build_ledger
from tests.approvals import make_pending
from tests.cli.conftest import Cli
from tests.harness import DSN, require_postgres

DEMO_KEY_PREFIX = "af4eff7e"  # the demo call's idempotency key starts with this


def test_init_is_idempotent(cli: Cli) -> None:
    """`init` twice succeeds and says where the ledger is."""
    for _ in range(2):
        done = cli("init")
        assert done.returncode == 0, done.stderr
        assert "ledger ready at" in done.stdout


def test_demo_twice_replays_from_the_store(cli: Cli) -> None:
    """The second demo run, a new process, charges nothing: the receipt was durable."""
    first, second = cli("demo"), cli("demo")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "charged once for 5 tries" in first.stdout
    assert "already in the store" in second.stdout and "not charged at all" in second.stdout
    assert "charged the card" not in second.stdout
    # The saga it plays after the payment was rolled back once, by the first run.
    assert "charged, reserved, shipping failed, released, refunded" in first.stdout
    assert "already rolled it back: nothing runs again" in second.stdout


def test_list_show_and_stats(cli: Cli) -> None:
    """The demo's effect is listed, shown by key prefix, and counted."""
    assert cli("demo", "payment").returncode == 0
    listed = cli("list")
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("CREATED (UTC)") and len(lines) == 3
    assert {line.split()[3] for line in lines[1:]} == {"payments.charge", "payments.refund"}
    assert all(len(line) <= 100 for line in lines)
    assert "\x1b[" not in listed.stdout  # no colour when not a terminal
    shown = cli("show", DEMO_KEY_PREFIX)
    assert shown.returncode == 0
    assert "status  succeeded" in shown.stdout and "duplicates  4" in shown.stdout
    record = json.loads(cli("show", DEMO_KEY_PREFIX, "--json").stdout)
    assert record["status"] == "succeeded" and record["dedup_count"] == 4
    stats = json.loads(cli("stats", "--json").stdout)
    assert (stats["total"], stats["duplicates"]) == (2, 4)
    assert stats["by_status"]["succeeded"] == stats["by_status"]["requires_approval"] == 1
    listed_json = json.loads(cli("list", "--json", "--tool", "payments.charge").stdout)
    assert [e["tool"] for e in listed_json["effects"]] == ["payments.charge"]
    assert json.loads(cli("list", "--json", "--status", "failed").stdout)["effects"] == []


def test_long_names_are_clipped_to_fit(cli: Cli) -> None:
    """A 200-character tool or workflow still gives lines of at most 100 columns."""
    assert cli("init").returncode == 0
    asyncio.run(_make(cli.url, ToolCall(workflow_id="w" * 200, tool="t" * 200)))
    lines = cli("list").stdout.splitlines()
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines)
    assert "…" in lines[1]


async def _make(url: str, call: ToolCall, result: object = "ok") -> None:
    store = await open_store(url)
    try:
        await build_ledger(store).run(call, lambda e: result)
    finally:
        await store.close()


def test_unknown_key_bad_url_and_missing_schema_are_one_line(cli: Cli, tmp_path: Path) -> None:
    """Errors are one line on stderr with the documented exit code, never a traceback."""
    assert cli("init").returncode == 0
    unknown = cli("show", "0123456789abcdef")
    assert (unknown.returncode, unknown.stderr.count("\n")) == (1, 1)
    assert "no effect matches" in unknown.stderr
    bad_ref = cli("approve", "not-a-key")
    assert bad_ref.returncode == 2 and "neither an effect id" in bad_ref.stderr
    bad_url = Cli("oracle://nope", tmp_path)("list")
    assert bad_url.returncode == 2 and bad_url.stderr.count("\n") == 1
    assert "unknown store URL scheme 'oracle'" in bad_url.stderr
    missing = Cli(f"sqlite:///{tmp_path / 'never-created.db'}", tmp_path)("list")
    assert missing.returncode == 1 and "agent-ledger init" in missing.stderr
    assert "Traceback" not in unknown.stderr + bad_ref.stderr + bad_url.stderr + missing.stderr


def test_usage_errors_exit_2(cli: Cli) -> None:
    """argparse errors and bad durations are usage errors."""
    assert cli("frobnicate").returncode == 2
    assert cli("list", "--since", "last tuesday").returncode == 2
    assert cli("purge", "--older-than", "soon", "--yes").returncode == 2
    too_long = cli("purge", "--older-than", "99999999999999999999d", "--yes")
    assert too_long.returncode == 2 and "Traceback" not in too_long.stderr
    assert len(too_long.stderr.splitlines()) == 1 and too_long.stderr.startswith("agent-ledger: ")
    assert (
        "duration too long: '99999999999999999999d' (at most 365000d, about 1000 years)"
        in too_long.stderr
    )


def test_approve_from_the_cli_wakes_a_waiting_run(cli: Cli) -> None:
    """`agent-ledger approve` in another process releases a run() waiting for approval."""
    assert cli("init").returncode == 0
    call = ToolCall(workflow_id="deploy-7", tool="k8s.deploy", args={"image": "app:v3"})

    async def scenario() -> tuple[Any, float]:
        store = await open_store(cli.url)
        try:
            ledger = build_ledger(store)
            options = RunOptions(
                requires_approval=True,
                concurrency=ConcurrencyOptions(initial_interval_ms=50, max_interval_ms=200),
            )
            waiting = asyncio.create_task(ledger.run(call, lambda e: "deployed", options))
            key = ledger.idem_key(call)
            for _ in range(500):
                effect = await ledger.find_by_idem_key(key)
                if effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL:
                    break
                await asyncio.sleep(0.02)
            pending = await asyncio.to_thread(cli, "pending", "--json")
            assert [e["idem_key"] for e in json.loads(pending.stdout)] == [key]
            approved = await asyncio.to_thread(
                cli, "approve", key[:10], "--by", "ada", "--note", "ok"
            )
            assert approved.returncode == 0, approved.stderr
            released_at = time.monotonic()
            result = await asyncio.wait_for(waiting, 10)
            return result, time.monotonic() - released_at
        finally:
            await store.close()

    result, delay = asyncio.run(scenario())
    assert result == "deployed"
    assert delay < 2.0
    shown = cli("show", "--json", ledger_key(call))
    record = json.loads(shown.stdout)
    assert (record["decided_by"], record["decision_note"], record["status"]) == (
        "ada",
        "ok",
        "succeeded",
    )
    again = cli("approve", ledger_key(call))
    assert again.returncode == 1 and "it is succeeded" in again.stderr


def ledger_key(call: ToolCall) -> str:
    from agent_ledger.keys import idempotency_key

    return idempotency_key(call)


def test_deny_and_cancel_record_reasons(cli: Cli) -> None:
    """deny --reason --by and cancel --reason are kept on the receipt."""
    assert cli("init").returncode == 0

    async def pending(tool: str) -> str:
        store = await open_store(cli.url)
        try:
            ledger = build_ledger(store)
            call = ToolCall(workflow_id="w", tool=tool)
            if tool == "to.deny":
                return (await make_pending(ledger, call)).idem_key
            return (await ledger.begin(call)).effect.idem_key
        finally:
            await store.close()

    deny_key, cancel_key = asyncio.run(pending("to.deny")), asyncio.run(pending("to.cancel"))
    assert cli("deny", deny_key, "--reason", "change freeze", "--by", "grace").returncode == 0
    assert cli("cancel", cancel_key, "--reason", "agent stopped").returncode == 0
    denied = json.loads(cli("show", "--json", deny_key).stdout)
    assert (denied["status"], denied["error_message"], denied["decided_by"]) == (
        "denied",
        "change freeze",
        "grace",
    )
    shown = cli("show", deny_key).stdout
    assert "decision  denied by grace" in shown
    canceled = json.loads(cli("show", "--json", cancel_key).stdout)
    assert (canceled["status"], canceled["error_message"]) == ("canceled", "agent stopped")


def test_export_round_trips_in_every_format(cli: Cli, tmp_path: Path) -> None:
    """json, jsonl and csv exports parse back to exactly the stored effects."""
    assert cli("init").returncode == 0
    calls = [
        ToolCall(workflow_id="w", tool="a", args={"n": 1, "s": 'ünï, "quoted"\nline'}),
        ToolCall(workflow_id="w", tool="b", args={}, call_id="c-1"),
    ]
    for i, call in enumerate(calls):
        asyncio.run(_make(cli.url, call, result={"i": i, "nested": [None, True, 1.5]}))

    async def stored() -> list[Any]:
        store = await open_store(cli.url)
        try:
            return (await build_ledger(store).list_effects()).effects
        finally:
            await store.close()

    expected = asyncio.run(stored())
    for fmt in ("json", "jsonl", "csv"):
        target = tmp_path / f"out.{fmt}"
        done = cli("export", "--format", fmt, "-o", str(target))
        assert done.returncode == 0, done.stderr
        text = target.read_text(encoding="utf-8")
        if fmt == "json":
            records = orjson.loads(text)
        elif fmt == "jsonl":
            records = [orjson.loads(line) for line in text.splitlines()]
        else:
            rows = list(csv.DictReader(io.StringIO(text)))
            assert list(rows[0]) == list(RECORD_FIELDS)
            records = [_from_csv(row) for row in rows]
        assert [effect_from_record(r) for r in records] == expected, fmt


def _from_csv(row: dict[str, str]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name, cell in row.items():
        if name in CSV_JSON_COLUMNS:
            record[name] = orjson.loads(cell)
        else:
            record[name] = None if cell == "" else cell
    return record


def test_purge_needs_confirmation_and_removes_old_terminal_effects(cli: Cli) -> None:
    """Without --yes and without a terminal, purge refuses; with --yes it deletes."""
    assert cli("demo", "payment").returncode == 0
    refused = cli("purge", "--older-than", "0s")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    kept = json.loads(cli("purge", "--older-than", "30d", "--yes", "--json").stdout)
    assert kept == {"removed": 0}
    removed = cli("purge", "--older-than", "0s", "--yes")
    assert removed.returncode == 0 and "removed 1 effect" in removed.stdout
    # The demo's refund still waits for approval: purge never touches it.
    left = json.loads(cli("stats", "--json").stdout)
    assert (left["total"], left["by_status"]["requires_approval"]) == (1, 1)


def test_default_url_comes_from_the_environment(run_cli: Any, tmp_path: Path) -> None:
    """Without --url: $AGENT_LEDGER_URL, else ./agent_ledger.db in the current folder."""
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    assert run_cli("demo", cwd=tmp_path, env=env).returncode == 0
    assert (tmp_path / "agent_ledger.db").exists()
    other = tmp_path / "elsewhere.db"
    done = run_cli("init", cwd=tmp_path, env={**env, "AGENT_LEDGER_URL": f"sqlite:///{other}"})
    assert done.returncode == 0 and other.exists()


@pytest.mark.postgres
@pytest.mark.parametrize("wrong", ["database", "port"])
def test_a_wrong_postgres_url_fails_at_once_naming_the_cause(tmp_path: Path, wrong: str) -> None:
    """A missing database or a closed port: one line with the server's reason, within
    seconds, not a PoolTimeout after the connect timeout (issue 10, item 19)."""
    require_postgres()
    parts = urlsplit(DSN)
    if wrong == "database":
        url, reason = (
            urlunsplit(parts._replace(path="/agent_ledger_nope")),
            ('database "agent_ledger_nope" does not exist'),
        )
    else:
        url = urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:1"))
        reason = "Connection refused"
    started = time.monotonic()
    done = Cli(url, tmp_path)("list")
    assert time.monotonic() - started < 8
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and reason in done.stderr
    assert "PoolTimeout" not in done.stderr and "Traceback" not in done.stderr


def test_ambiguous_attempts_from_a_shell(cli: Cli) -> None:
    """park-stale, pending's reason/attempt/start/worker, resolve and --expected-attempt."""
    assert cli("init").returncode == 0
    charge = ToolCall(workflow_id="order-7", tool="payments.charge", args={"cents": 500})
    deploy = ToolCall(workflow_id="order-7", tool="k8s.deploy", args={"v": 2})

    async def dead_worker() -> tuple[str, str]:
        store = await open_store(cli.url)
        try:
            ledger = build_ledger(store)
            park = RunOptions(on_stale="park", stale=StaleOptions(after_ms=100))
            begun = await ledger.begin(charge, run_options=park)  # then the worker dies
            pending = await make_pending(ledger, deploy)
            assert begun.effect.worker is not None
            return begun.effect.idem_key, pending.idem_key
        finally:
            await store.close()

    key, approval_key = asyncio.run(dead_worker())
    time.sleep(0.3)
    swept = cli("park-stale")
    assert swept.returncode == 0 and f"parked payments.charge ({key[:12]})" in swept.stdout
    assert swept.stderr == "", "no stray log line (issue 30)"
    assert cli("park-stale").stdout.strip() == "nothing to park"
    table = cli("pending")
    assert table.returncode == 0
    (parked_line,) = [line for line in table.stdout.splitlines() if key[:12] in line]
    (approval_line,) = [line for line in table.stdout.splitlines() if approval_key[:12] in line]
    assert "ambiguous attempt" in parked_line and f":{os.getpid()}" in parked_line
    assert "approval" in approval_line and "ambiguous" not in approval_line
    listed = {e["idem_key"]: e for e in json.loads(cli("pending", "--json").stdout)}
    assert listed[key]["pending_reason"] == "ambiguous attempt"
    assert listed[key]["error_code"] == "ambiguous_attempt" and listed[key]["attempt"] == 1
    assert listed[approval_key]["pending_reason"] == "approval"

    # Bad input: a usage error, nothing changed.
    for args in (
        ("--result", "{not json", "--by", "ops"),
        ("--by", "ops"),
        ("--result", "1", "--error", "x", "--by", "ops"),
        ("--result", "1", "--by", ""),
    ):
        bad = cli("resolve", key[:12], *args)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, (args, bad.stderr)
    stale = cli("approve", key[:12], "--by", "ops", "--expected-attempt", "2")
    assert stale.returncode == 1 and "at attempt 1, not 2" in stale.stderr
    refused = cli("resolve", approval_key[:12], "--result", "1", "--by", "ops")
    # In the CLI's own words (issue 30): the commands, not the Python calls.
    assert refused.returncode == 1 and refused.stderr.startswith("agent-ledger: ")
    assert f"agent-ledger approve {approval_key[:12]}" in refused.stderr
    assert f"agent-ledger deny {approval_key[:12]}" in refused.stderr
    assert "approve()" not in refused.stderr
    resolved = cli(
        "resolve", key[:12], "--result", '{"charge": "ch_1"}', "--by", "ops",
        "--note", "seen at the provider", "--expected-attempt", "1",
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr
    assert "is now succeeded" in resolved.stdout
    record = json.loads(cli("show", "--json", key).stdout)
    assert record["status"] == "succeeded" and record["result"] == {"charge": "ch_1"}
    assert [e["kind"] for e in record["history"]] == ["parked", "settled"]
    assert record["history"][1]["by"] == "ops" and record["history"][1]["attempt"] == 1
    receipt = cli("show", key).stdout
    assert "parked" in receipt and "resolved" in receipt
    again = cli("deny", key[:12], "--expected-attempt", "1")
    assert again.returncode == 1 and "it is succeeded" in again.stderr
