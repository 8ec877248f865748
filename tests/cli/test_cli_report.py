"""`export --format md` (the incident report) and the new list/export filters,
through the real console script on SQLite and PostgreSQL.

The report is parsed with a CommonMark parser (markdown-it, GFM tables on),
so its structure is checked as a renderer sees it, including with args,
errors and notes written to break out of their code blocks.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from agent_ledger import ApprovalPendingError, Effect, RunOptions, ToolCall
from agent_ledger.errors import HandlerTimeoutError
from agent_ledger.stores.url import open_store
from agent_ledger.testing import build_ledger
from tests.cli.conftest import Cli

#: Text written to escape: close a fence, start a heading, inject HTML, break a table.
HOSTILE = "````\n# Injected heading\n<script>alert(1)</script>\n| a | b |\n`tick` ``"
FAILURES = ("failed", "canceled", "denied")


class Declined(Exception):
    code = "card_declined"


async def populate(url: str) -> dict[str, str]:
    """Five effects in workflow incident-7 (and one elsewhere); tool -> idempotency key."""
    store = await open_store(url)
    keys: dict[str, str] = {}
    try:
        ledger = build_ledger(store)

        def call(tool: str, workflow: str = "incident-7") -> ToolCall:
            return ToolCall(workflow_id=workflow, tool=tool, args={"note": HOSTILE})

        charge = ToolCall(
            workflow_id="incident-7", tool="pay.charge", args={"note": HOSTILE}, call_id="call-1"
        )
        await ledger.run(charge, lambda e: {"charge": "ch_1", "echo": HOSTILE})
        keys["pay.charge"] = ledger.idem_key(charge)

        def decline(effect: Effect) -> None:
            raise Declined(HOSTILE)

        with pytest.raises(Declined):
            await ledger.run(call("pay.refund"), decline)
        keys["pay.refund"] = ledger.idem_key(call("pay.refund"))

        async def hang(effect: Effect) -> None:
            await asyncio.sleep(60)

        with pytest.raises(HandlerTimeoutError):
            await ledger.run(call("mail.send"), hang, RunOptions(timeout_ms=300))
        keys["mail.send"] = ledger.idem_key(call("mail.send"))
        asking = RunOptions(requires_approval=True, wait_for_approval=False)
        for tool in ("db.drop", "db.vacuum"):
            with pytest.raises(ApprovalPendingError):
                await ledger.run(call(tool), lambda e: "ran", asking)
            keys[tool] = ledger.idem_key(call(tool))
        await ledger.deny(keys["db.drop"], reason=HOSTILE, by="ops <b>lead</b>")
        await ledger.run(call("other.tool", workflow="elsewhere"), lambda e: None)
    finally:
        await store.close()
    return keys


def parse(text: str) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(text)


def headings(tokens: list[Token], level: int) -> list[str]:
    tag = f"h{level}"
    return [
        tokens[i + 1].content
        for i, token in enumerate(tokens)
        if token.type == "heading_open" and token.tag == tag
    ]


def test_the_report_lists_every_selected_effect_failures_first(cli: Cli) -> None:
    assert cli("init").returncode == 0
    keys = asyncio.run(populate(cli.url))
    done = cli("export", "--format", "md", "--workflow", "incident-7")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    tokens = parse(done.stdout)
    assert headings(tokens, 1) == ["Incident report: agent-ledger effects"]
    assert headings(tokens, 2) == ["Summary", "Effects"]
    sections = headings(tokens, 3)
    assert sections[0] == "Failures"
    effects = sections[1:]
    assert len(effects) == len(keys)  # every selected effect, and only those
    statuses = [title.split(" ")[1].rstrip(":") for title in effects]
    assert statuses == ["failed", "canceled", "denied", "requires_approval", "succeeded"]
    for key in keys.values():
        assert sum(key[:12] in title for title in effects) == 1
    assert "elsewhere" not in done.stdout and "other.tool" not in done.stdout
    # The summary's failure list names the three failures, in the same order.
    failure_items = [
        tokens[i + 2].content
        for i, token in enumerate(tokens)
        if token.type == "list_item_open" and token.info in ("1", "2", "3")
    ]
    assert [item.split("**")[1] for item in failure_items] == list(FAILURES)
    # Tables: one row per status present, one per tool.
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) == (1 + 5) + (1 + 5)
    # Nothing an agent wrote became markup: the only HTML is the report's own anchors.
    html = [t.content.strip() for t in tokens if t.type == "html_block"]
    html += [
        child.content
        for t in tokens
        if t.type == "inline" and t.children
        for child in t.children
        if child.type == "html_inline"
    ]
    anchors = [(f'<a id="effect-{n}">', "</a>") for n in range(1, 6)]
    assert html == [tag for pair in anchors for tag in pair]
    # Every value comes back whole from its block: the error, the denial reason,
    # the args of all five effects and the result.
    texts = [t.content for t in tokens if t.type == "fence" and t.info == "text"]
    assert sum(content == HOSTILE + "\n" for content in texts) == 2
    values = [json.loads(t.content) for t in tokens if t.type == "fence" and t.info == "json"]
    assert sum(value.get("note") == HOSTILE for value in values) == 5
    assert {"charge": "ch_1", "echo": HOSTILE} in values
    assert all("Injected heading" not in title for title in sections)
    # Each section has its receipt, decision and error.
    text = done.stdout
    for label in ("**Args**", "**Decision**", "**Error**"):
        assert text.count(label) == 5
    assert "Code `handler_timeout`" in text and "Code `card_declined`" in text
    assert "By `ops <b>lead</b>`" in text


def test_the_report_of_nothing_and_to_a_file(cli: Cli) -> None:
    assert cli("init").returncode == 0
    empty = cli("export", "--format", "md", "--tool", "nope")
    assert empty.returncode == 0 and "No effect matches." in empty.stdout
    assert headings(parse(empty.stdout), 2) == ["Summary", "Effects"]
    written = cli("export", "--format", "md", "-o", str(cli.cwd / "report.md"))
    assert (
        written.returncode == 0
        and written.stderr == "exported 0 effects to " + str(cli.cwd / "report.md") + "\n"
    )
    assert (cli.cwd / "report.md").read_text().startswith("# Incident report")


def test_list_and_export_filter_by_duration_error_code_and_call_id(cli: Cli) -> None:
    assert cli("init").returncode == 0
    keys = asyncio.run(populate(cli.url))

    def listed(*flags: str) -> set[str]:
        done = cli("list", "--json", "--limit", "100", *flags)
        assert done.returncode == 0, done.stderr
        return {e["tool"] for e in json.loads(done.stdout)["effects"]}

    # mail.send ran 300 ms to its deadline; the others ran at once or not at all.
    assert listed("--min-duration", "250ms") == {"mail.send"}
    assert listed("--max-duration", "250ms") == {"pay.charge", "pay.refund", "other.tool"}
    assert listed("--error-code", "handler_timeout") == {"mail.send"}
    assert listed("--error-code", "card_declined") == {"pay.refund"}
    assert listed("--call-id", "call-1") == {"pay.charge"}
    exported = cli("export", "--format", "jsonl", "--error-code", "denied")
    assert [json.loads(line)["idem_key"] for line in exported.stdout.splitlines()] == [
        keys["db.drop"]
    ]
    report = cli("export", "--format", "md", "--min-duration", "250ms")
    assert headings(parse(report.stdout), 3)[1:] == [
        f"1. canceled: `mail.send` ({keys['mail.send'][:12]})"
    ]
    assert "Selected by --min-duration `250ms`." in report.stdout
    # Exact, in a form the CLI reads (it was `6.048e+08ms` and `1.23457e+09ms`).
    report = cli(
        "export", "--format", "md", "--min-duration", "1w", "--max-duration", "1234567891ms"
    )
    assert "--min-duration `1w`" in report.stdout
    assert "--max-duration `2w6h56m7s891ms`" in report.stdout


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--min-duration", "fast"], "not a duration"),
        (["--max-duration=-5s"], "not a duration"),
        (["--min-duration", "2s", "--max-duration", "1s"], "no effect could match"),
        (["--min-duration", "999999999d"], "duration too long"),
        (["--max-duration", "99999999999999999999d"], "duration too long"),
        (["--since", "99999999999999999999d"], "duration too long"),
        (["--until", "400000d"], "duration too long"),
    ],
)
def test_bad_filters_are_one_line(cli: Cli, flags: list[str], says: str) -> None:
    assert cli("init").returncode == 0
    for command in (["list"], ["export", "--format", "md"]):
        done = cli(*command, *flags)
        assert done.returncode == 2
        assert says in done.stderr and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1 or done.stderr.startswith("usage:")
