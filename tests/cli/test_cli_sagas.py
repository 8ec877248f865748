"""`agent-ledger sagas [list|show|recover]` and `agent-ledger demo saga`, through the
real console script, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import orjson
import pytest

from agent_ledger import open_store
from agent_ledger.sagas import SagaCompensationFailed
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli
from tests.sagas.conftest import shop_of

APP = """
from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore

# Only its tools are used: the command's --url names the store.
ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))


@ledger.tool("s1", compensate="undo.s1")
async def s1(item: str) -> str:
    return item


@ledger.tool("undo.s1")
async def undo_s1(forward) -> str:
    with open({log!r}, "a") as f:
        f.write("undo s1\\n")
    return "undone"
"""


def test_demo_saga_rolls_back_and_a_second_run_runs_nothing(cli: Cli) -> None:
    first = cli("demo", "saga")
    assert first.returncode == 0, first.stderr
    assert "charged, reserved, shipping failed, released, refunded" in first.stdout
    assert "saga order-2077: compensated" in first.stdout
    assert '"refund_id":"re_2077"' in first.stdout
    again = cli("demo", "saga")
    assert again.returncode == 0 and "nothing runs again" in again.stdout
    listed = cli("sagas", "list")
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[1].split()[2:4] == ["compensated", "order-2077"]
    shown = cli("sagas", "show", "order-2077", "--json")
    record = orjson.loads(shown.stdout)
    assert [s["tool"] for s in record["steps"]] == [
        "payments.charge",
        "inventory.reserve",
        "shipping.book",
    ]
    assert [s["undo"] and s["undo"]["status"] for s in record["steps"]] == [
        "succeeded",
        "succeeded",
        None,
    ]
    missing = cli("sagas", "show", "nope")
    assert missing.returncode == 1 and missing.stderr == "agent-ledger: no saga 'nope'\n"


def test_a_saga_whose_undo_keeps_failing_is_listed_for_a_person(cli: Cli) -> None:
    assert cli("init").returncode == 0

    async def stuck() -> None:
        store = await open_store(cli.url)
        ledger = build_ledger(store)
        shop = shop_of(ledger, "s1", "s2")
        shop.failing.add("s2")
        shop.undo_fails.add("s1")
        with pytest.raises(SagaCompensationFailed, match="could not be undone"):
            async with ledger.saga("stuck"):
                await shop["s1"]("a")
                await shop["s2"]("b")
        async with ledger.saga("fine"):
            await shop["s1"]("c")
        await store.close()

    asyncio.run(stuck())
    failed = cli("sagas", "list", "--status", "compensation_failed")
    assert failed.returncode == 0
    assert [line.split()[3] for line in failed.stdout.splitlines()[1:]] == ["stuck"]
    shown = cli("sagas", "show", "stuck")
    assert "undo   undo.s1 failed, 3 tries" in shown.stdout
    assert "s1 is down" in shown.stdout


def test_recover_finishes_an_abandoned_saga_with_the_apps_tools(cli: Cli, tmp_path: Path) -> None:
    assert cli("init").returncode == 0
    log = tmp_path / "undo.log"
    (tmp_path / "shopapp.py").write_text(textwrap.dedent(APP.format(log=str(log))))

    async def abandon() -> None:
        from datetime import timedelta

        store = await open_store(cli.url)
        ledger = build_ledger(store)
        shop = shop_of(ledger, "s1")
        saga = ledger.saga("left", lease_ms=100, abandon_after=timedelta(0))
        await saga.__aenter__()
        await shop["s1"]("a")
        assert saga._heartbeat is not None
        saga._heartbeat.stop()  # the worker "dies"
        await asyncio.sleep(0.3)
        await store.close()

    asyncio.run(abandon())
    named = cli("sagas", "recover", "left", "--app", "shopapp:ledger")
    assert named.returncode == 2 and named.stdout == "", "an id is refused, not ignored"
    assert "sagas recover takes no SAGA_ID" in named.stderr and named.stderr.count("\n") == 1
    assert not log.exists(), "nothing was recovered"
    without = cli("sagas", "recover")
    assert without.returncode == 1 and "not registered" in without.stdout
    # One line for the log, no traceback: the tool is missing, not a bug.
    assert "Traceback" not in without.stderr and without.stderr.count("\n") <= 1
    done = cli("sagas", "recover", "--app", "shopapp:ledger")
    assert done.returncode == 0, done.stderr
    assert "finished left: compensated" in done.stdout
    assert log.read_text() == "undo s1\n"
    assert cli("sagas", "recover").stdout == "no saga needed recovery\n"
    bad = cli("sagas", "recover", "--app", "shopapp")
    assert bad.returncode == 2 and "MODULE:ATTRIBUTE" in bad.stderr


EVIL = "order\x1b]0;pwned\x07-1\u202e"


def test_stored_text_is_printed_escaped_by_list_show_and_recover(cli: Cli) -> None:
    """Saga ids, owners, tool names and errors are chosen by agents: printed raw,
    a terminal control in one could rewrite what the person reads."""
    assert cli("init").returncode == 0

    async def evil() -> None:
        store = await open_store(cli.url)
        ledger = build_ledger(store)

        @ledger.tool("ship\x9b2J")
        async def ship(item: str) -> str:
            raise RuntimeError("no courier\x1b[2J\x1b[31mALL GOOD\u202e")

        with pytest.raises(Exception, match="no courier"):
            async with ledger.saga(EVIL, owner="host\x1b[1A"):
                await ship("a")
        kept = ledger.saga(EVIL + "kept", owner="host\x1b[1A")  # left running: listed
        await kept.__aenter__()
        assert kept._heartbeat is not None
        kept._heartbeat.stop()
        await store.close()

    asyncio.run(evil())
    outputs = {
        "list": cli("sagas", "list"),
        "show": cli("sagas", "show", EVIL),
        "show missing": cli("sagas", "show", EVIL + "nope"),
        "recover": cli("sagas", "recover"),
    }
    for name, out in outputs.items():
        # An unknown saga is an error: on stderr, escaped like everything else.
        text = out.stderr if name == "show missing" else out.stdout
        assert text, name
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in text, (name, raw, text)
    assert "order\\x1b]0;pwned\\x07-1\\u202e" in outputs["show"].stdout
    assert "no courier\\x1b[2J" in outputs["show"].stdout
    assert "ship\\x9b2J" in outputs["show"].stdout
    assert "host\\x1b[1A" in outputs["recover"].stdout


INVISIBLE = "order\u200b-\u2060\ufeff\u00ad9"


def test_zero_width_and_other_format_characters_are_printed_escaped(cli: Cli) -> None:
    """Two ids that differ by a zero-width character would print the same."""
    assert cli("init").returncode == 0

    async def invisible() -> None:
        store = await open_store(cli.url)
        ledger = build_ledger(store)
        shop = shop_of(ledger, "s1")
        async with ledger.saga(INVISIBLE, owner="host\u200b"):
            await shop["s1"]("a")
        await store.close()

    asyncio.run(invisible())
    for out in (cli("sagas", "list"), cli("sagas", "show", INVISIBLE)):
        assert out.returncode == 0, out.stderr
        assert "order\\u200b-\\u2060\\ufeff\\xad9" in out.stdout, out.stdout
        for raw in ("\u200b", "\u2060", "\ufeff", "\u00ad"):
            assert raw not in out.stdout


@pytest.mark.parametrize("action", ["list", "recover"])
def test_a_bad_limit_is_one_line_on_stderr(cli: Cli, action: str) -> None:
    assert cli("init").returncode == 0
    out = cli("sagas", action, "--limit", "-1")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "agent-ledger: limit must be an int from 1 to 1000, got -1\n"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('raise RuntimeError("config\\nmissing")\n', "RuntimeError: config\\x0amissing"),
        ("def f(:\n", "SyntaxError: "),
        (None, "ModuleNotFoundError: No module named 'brokenapp'"),
    ],
    ids=["raises", "syntax error", "missing"],
)
def test_an_app_that_fails_to_import_is_one_line_on_stderr(
    cli: Cli, tmp_path: Path, source: str | None, problem: str
) -> None:
    assert cli("init").returncode == 0
    if source is not None:
        (tmp_path / "brokenapp.py").write_text(source)
    out = cli("sagas", "recover", "--app", "brokenapp:ledger")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("agent-ledger: --app brokenapp:ledger: importing 'brokenapp'")
    assert problem in out.stderr and out.stderr.count("\n") == 1, out.stderr
