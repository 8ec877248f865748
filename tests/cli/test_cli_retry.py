"""`agent-ledger retry`: a person sends a failed or canceled effect back to run again."""

from __future__ import annotations

import asyncio
import contextlib
import json

from agent_ledger import Effect, ToolCall
from agent_ledger.stores.url import open_store
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli

FAILS = ToolCall(workflow_id="w", tool="mail.send", args={"to": "ada"})
WORKS = ToolCall(workflow_id="w", tool="mail.send", args={"to": "bob"})


async def _run(url: str, call: ToolCall, fail: bool) -> str:
    """Run ``call`` once through a ledger on ``url``; return its key."""
    store = await open_store(url)
    try:
        ledger = build_ledger(store)

        def handler(effect: Effect) -> str:
            if fail:
                raise NameError("name 'recipent' is not defined")
            return "sent"

        with contextlib.suppress(NameError):
            await ledger.run(call, handler)
        return ledger.idem_key(call)
    finally:
        await store.close()


def test_retry_reopens_a_failed_effect_and_says_who_and_why(cli: Cli) -> None:
    assert cli("init").returncode == 0
    failed = asyncio.run(_run(cli.url, FAILS, fail=True))
    done = cli("retry", failed[:12], "--by", "ada", "--reason", "typo fixed")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"mail.send ({failed[:12]}) is now ready: the next call with its key runs it again\n"
    )
    shown = cli("show", failed[:12]).stdout
    assert "decision  reopened by ada: typo fixed" in shown
    assert "by ada: typo fixed; was failed ([NameError] name 'recipent' is not defined)" in shown
    again = cli("retry", failed[:12], "--by", "ada", "--reason", "twice")
    assert again.returncode == 1
    assert "cannot retry" in again.stderr and "it is ready" in again.stderr
    as_json = cli("retry", failed[:12], "--by", "ada", "--reason", "twice", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["transitioned"] is False
    assert asyncio.run(_run(cli.url, FAILS, fail=False)) == failed
    record = json.loads(cli("show", failed, "--json").stdout)
    assert (record["status"], record["result"], record["tries"]) == ("succeeded", "sent", 1)
    assert [event["kind"] for event in record["history"]] == ["reopened"]


def test_retry_refuses_a_success_and_needs_who_and_why(cli: Cli) -> None:
    assert cli("init").returncode == 0
    worked = asyncio.run(_run(cli.url, WORKS, fail=False))
    refused = cli("retry", worked[:12], "--by", "ada", "--reason", "again")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "its result is the receipt" in refused.stderr
    missing = cli("retry", worked[:12], "--reason", "again")
    assert missing.returncode == 2 and "--by" in missing.stderr
    empty = cli("retry", worked[:12], "--by", "", "--reason", "again")
    assert empty.returncode == 2 and "by is required" in empty.stderr
    assert "Traceback" not in refused.stderr + missing.stderr + empty.stderr
