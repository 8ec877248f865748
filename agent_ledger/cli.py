"""``agent-ledger``: see what your agent did, and approve or deny from a shell.

Exit codes: 0 ok; 1 not found, not transitioned, or the store failed;
2 usage error (bad arguments, bad URL, bad input). Errors are one line on
stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import getpass
import io
import itertools
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final, NoReturn, TypeVar
from urllib.parse import urlsplit

import orjson

from agent_ledger._version import __version__
from agent_ledger.approvals import DecisionAction
from agent_ledger.audit import MAX_SPAN
from agent_ledger.budgets import BudgetState
from agent_ledger.deciding import decide_from_cli
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    DecisionRefusedError,
    EffectLedgerError,
    EffectLedgerValidationError,
    EffectStoreError,
)
from agent_ledger.ledger import EffectLedger
from agent_ledger.options import EffectLedgerOptions
from agent_ledger.receipt import RECORD_FIELDS, effect_to_record, render_receipt, visible
from agent_ledger.report import render_report
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores.base import Store
from agent_ledger.stores.budget_base import BudgetStore
from agent_ledger.stores.url import URL_ENV, default_url, open_store, sqlite_folder

_T = TypeVar("_T")

EXIT_OK: Final = 0
EXIT_NOT_DONE: Final = 1
EXIT_USAGE: Final = 2
#: Human output is laid out to fit this many columns.
WIDTH: Final = 100

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNITS: Final = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_COLOURS: Final = {
    EffectStatus.SUCCEEDED: "32",
    EffectStatus.FAILED: "31",
    EffectStatus.DENIED: "31",
    EffectStatus.CANCELED: "90",
    EffectStatus.REQUIRES_APPROVAL: "33",
    EffectStatus.READY: "36",
    EffectStatus.PROCESSING: "34",
}


class UsageError(Exception):
    """Bad arguments that argparse itself cannot see; exit code 2."""


def _duration_parts(text: str) -> list[tuple[str, str]]:
    """``text``'s (number, unit) pairs, or none when it is not a duration."""
    parts: list[tuple[str, str]] = _DURATION.findall(text)
    return parts if parts and "".join(n + u for n, u in parts) == text else []


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``90s``, ``500ms``, ``2w``, or combinations like ``1h30m``."""
    parts = _duration_parts(text)
    if not parts:
        raise UsageError(f"not a duration: {text!r} (examples: 30d, 12h, 15m, 1h30m)")
    try:
        span = sum((int(n) * _UNITS[u] for n, u in parts), timedelta())
    except (OverflowError, ValueError):  # past a timedelta, or past int()'s digit limit
        span = None
    # The ledger refuses spans past MAX_SPAN on every store; saying so here
    # names the option, and keeps `--since 999999999d` from overflowing a date.
    if span is None or span > MAX_SPAN:
        raise UsageError(
            f"duration too long: {_clip(text, 40)!r} (at most {MAX_SPAN.days}d, about 1000 years)"
        )
    return span


def format_duration(span: timedelta) -> str:
    """``span`` exactly, in the form ``parse_duration`` reads (``1w``, ``1h30m``, ``250ms``).

    Largest units first; sub-millisecond parts are never there (the CLI reads
    whole milliseconds), so ``parse_duration(format_duration(d)) == d``.
    """
    left = span // timedelta(milliseconds=1)
    parts = []
    for unit in ("w", "d", "h", "m", "s", "ms"):
        size = _UNITS[unit] // timedelta(milliseconds=1)
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def parse_moment(text: str) -> datetime:
    """An ISO 8601 time (UTC when it has no offset), or a duration ago (``2h``)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        if text.startswith(("-", "+")) and _duration_parts(text[1:]):
            raise UsageError(
                f"not a time: {text!r}; a duration is always ago and takes no sign: "
                f"{text[1:]} means {text[1:]} ago"
            ) from None
        if not _duration_parts(text):
            raise UsageError(
                f"not a time: {text!r} (use ISO 8601 like 2026-01-31T12:00, or 2h for 2 hours ago)"
            ) from None
        # At most MAX_SPAN (parse_duration checks), so this never leaves the calendar.
        return datetime.now(UTC) - parse_duration(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# -- output ---------------------------------------------------------------------


@dataclass
class Output:
    stream: IO[str]
    colour: bool

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")

    def json(self, value: object) -> None:
        self.stream.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")

    def status(self, status: EffectStatus, width: int) -> str:
        text = status.value.ljust(width)
        return f"\x1b[{_COLOURS[status]}m{text}\x1b[0m" if self.colour else text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def effects_table(out: Output, effects: Sequence[Effect]) -> None:
    """One aligned line per effect, at most ``WIDTH`` columns."""
    if not effects:
        out.line("no effects")
        return
    # RUNS is how often a handler ran (executions), not the fencing attempt.
    headers = ("CREATED (UTC)", "STATUS", "TOOL", "WORKFLOW", "RUNS", "DUP", "KEY")
    rows = [
        (
            e.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            e.status,
            visible(e.tool),
            visible(e.workflow_id),
            str(e.executions),
            str(e.dedup_count),
            e.idem_key[:12],
        )
        for e in effects
    ]
    fixed = [max(len(headers[i]), *(len(str(r[i])) for r in rows)) for i in (0, 1, 4, 5, 6)]
    flexible = WIDTH - sum(fixed) - 2 * (len(headers) - 1)
    tool_w = min(max(len(r[2]) for r in rows), max(len(headers[2]), flexible // 2))
    tool_w = max(tool_w, len(headers[2]))
    flow_w = min(max(len(headers[3]), *(len(r[3]) for r in rows)), flexible - tool_w)
    widths = (fixed[0], fixed[1], tool_w, flow_w, fixed[2], fixed[3], fixed[4])
    out.line("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for created, status, tool, flow, att, dup, key in rows:
        cells = [
            created.ljust(widths[0]),
            out.status(status, widths[1]),
            _clip(tool, widths[2]).ljust(widths[2]),
            _clip(flow, widths[3]).ljust(widths[3]),
            att.rjust(widths[4]),
            dup.rjust(widths[5]),
            key,
        ]
        out.line("  ".join(cells))


# -- commands ---------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    store: Store
    ledger: EffectLedger
    out: Output


async def cmd_init(ctx: Context) -> int:
    # The store's tables were created on opening (see _dispatch).
    if ctx.args.partitioned:
        # PostgreSQL only: partition the effects table (converting one that
        # holds effects: docs/postgres.md, "A hundred million effects").
        partition = getattr(ctx.store, "partition", None)
        if partition is None:
            raise UsageError("--partitioned is for PostgreSQL URLs (postgresql://...)")
        done = await partition(period=ctx.args.period)
        by = f" by {ctx.args.period}" if done == "partitioned" else " (its period unchanged)"
        ctx.out.line(f"effects table {done}{by}")
    if ctx.args.roles:
        await _install_roles(ctx)
    elif ctx.args.role_prefix is not None or ctx.args.separate_duty is not None:
        raise UsageError("--role-prefix and --separate-duty go with --roles")
    ctx.out.line(f"ledger ready at {ctx.args.url}")
    return EXIT_OK


async def _install_roles(ctx: Context) -> None:
    """``init --roles``: PostgreSQL's role set (docs/postgres.md, "Roles")."""
    install = getattr(ctx.store, "install_roles", None)
    if install is None:
        raise UsageError(
            "--roles is for PostgreSQL URLs (postgresql://...): SQLite and memory stores "
            "trust the process that opens them"
        )
    prefix = ctx.args.role_prefix
    roles = await install(
        **({} if prefix is None else {"prefix": prefix}), separate_duty=ctx.args.separate_duty
    )
    duty = "on" if roles.separate_duty else "off"
    ctx.out.line(
        f"roles ready: owner {roles.owner}, worker {roles.worker}, approver {roles.approver} "
        f"(separation of duty {duty})"
    )
    ctx.out.line(
        f"grant them to login roles, e.g. GRANT {roles.worker} TO my_agent; "
        f"GRANT {roles.approver} TO my_console;"
    )


async def cmd_migrate(ctx: Context) -> int:
    # The store was opened without creating or checking anything (see _dispatch).
    found, left = await ctx.store.migrate()
    if ctx.args.json:
        ctx.out.json({"from_version": found, "to_version": left, "changed": found != left})
    elif found == left:
        ctx.out.line(f"schema already at version {left}: nothing to do")
    elif found == 0:
        ctx.out.line(f"created the schema at version {left}")
    else:
        ctx.out.line(f"migrated the schema from version {found} to {left}")
    return EXIT_OK


async def cmd_demo(ctx: Context) -> int:
    from agent_ledger.demo import run_demo, run_saga_demo

    which = ctx.args.which
    charged_once = True
    if which in ("all", "payment"):
        api = await run_demo(ctx.store, ctx.out.line)
        charged_once = len(api.charges) <= 1
    if which == "all":
        ctx.out.line("\n" + "-" * 72 + "\n")
    if which in ("all", "saga"):
        await run_saga_demo(ctx.store, ctx.out.line)
    return EXIT_OK if charged_once else EXIT_NOT_DONE


#: How many workflows' spend ``stats`` lists (most recently changed first).
STATS_BUDGETS: Final = 20


def _amount(value: float | int | None, unit: str) -> str:
    if value is None:
        return "unlimited"
    return f"${value:,.6f}" if unit == "usd" else f"{value:,}"


def _budget_lines(state: BudgetState) -> list[str]:
    """``budget show``: one line per unit: limit, spent, reserved, remaining."""
    limits, spent, reserved, remaining = (
        state.limits,
        state.spent,
        state.reserved,
        state.remaining(),
    )
    rows = [
        ("usd", limits.usd, spent.usd, reserved.usd),
        ("input_tokens", limits.input_tokens, spent.input_tokens, reserved.input_tokens),
        ("output_tokens", limits.output_tokens, spent.output_tokens, reserved.output_tokens),
        ("tool_calls", limits.tool_calls, spent.tool_calls, reserved.tool_calls),
    ]
    lines = [
        f"budget of workflow {visible(state.workflow_id)} "
        f"({_count(state.holds, 'open hold')}, updated {state.updated_at.isoformat()})",
        "",
        f"  {'unit':<13}  {'limit':>18}  {'spent':>18}  {'reserved':>18}  {'remaining':>18}",
    ]
    for unit, limit, used, held in rows:
        lines.append(
            f"  {unit:<13}  {_amount(limit, unit):>18}  {_amount(used, unit):>18}  "
            f"{_amount(held, unit):>18}  {_amount(remaining[unit], unit):>18}"
        )
    return lines


async def cmd_budget(ctx: Context) -> int:
    store = ctx.store
    if not isinstance(store, BudgetStore):
        raise UsageError(f"{type(store).__name__} keeps no budgets")
    state = await store.get_budget(ctx.args.workflow_id)
    if state is None:
        _say(f"no budget is stored for workflow {ctx.args.workflow_id!r}")
        return EXIT_NOT_DONE
    if ctx.args.json:
        ctx.out.json(state.to_json())
    else:
        for line in _budget_lines(state):
            ctx.out.line(line)
    return EXIT_OK


async def cmd_sagas(ctx: Context) -> int:
    from agent_ledger.saga_commands import sagas_command

    return await sagas_command(ctx.ledger, ctx.args, ctx.out.line, ctx.out.json)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workflow_id": args.workflow,
        "tool": args.tool,
        "status": args.status,
        "since": args.since,
        "until": args.until,
        "call_id": args.call_id,
        "error_code": args.error_code,
        "min_duration": args.min_duration,
        "max_duration": args.max_duration,
    }


async def cmd_list(ctx: Context) -> int:
    args = ctx.args
    page = await ctx.ledger.list_effects(**_filters(args), limit=args.limit, cursor=args.cursor)
    if args.json:
        ctx.out.json(
            {
                "effects": [effect_to_record(e) for e in page.effects],
                "next_cursor": page.next_cursor,
            }
        )
        return EXIT_OK
    effects_table(ctx.out, page.effects)
    if page.next_cursor is not None:
        ctx.out.line(f"(more: add --cursor {page.next_cursor})")
    return EXIT_OK


def pending_reason(effect: Effect) -> str:
    """Why an effect waits for a person, in a word or two."""
    return "ambiguous attempt" if effect.parked else "approval"


def pending_table(out: Output, effects: Sequence[Effect]) -> None:
    """One line per waiting effect: why it waits, and for a parked one which
    attempt ran, when it started and where (the worker), so a person knows what
    to check downstream before settling it."""
    if not effects:
        out.line("no effects waiting for a person")
        return
    headers = ("CREATED (UTC)", "REASON", "ATT", "STARTED (UTC)", "WORKER", "TOOL", "KEY")
    rows = [
        (
            e.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            pending_reason(e),
            str(e.attempt) if e.parked else "-",
            e.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
            if e.parked and e.started_at is not None
            else "-",
            _clip(visible(e.worker), 24) if e.parked and e.worker else "-",
            _clip(visible(e.tool), 28),
            e.idem_key[:12],
        )
        for e in effects
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        out.line("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


async def cmd_pending(ctx: Context) -> int:
    effects = await ctx.ledger.pending_approvals(limit=ctx.args.limit)
    if ctx.args.json:
        ctx.out.json(
            [{**effect_to_record(e), "pending_reason": pending_reason(e)} for e in effects]
        )
    else:
        pending_table(ctx.out, effects)
    return EXIT_OK


async def cmd_park_stale(ctx: Context) -> int:
    parked = await ctx.ledger.park_stale()
    if ctx.args.json:
        ctx.out.json([effect_to_record(e) for e in parked])
    else:
        for effect in parked:
            ctx.out.line(
                f"parked {visible(effect.tool)} ({effect.idem_key[:12]}), attempt "
                f"{effect.attempt}: settle it with approve, deny or resolve"
            )
        if not parked:
            ctx.out.line("nothing to park")
    return EXIT_OK


async def cmd_sweep(ctx: Context) -> int:
    """``sweep``: deny every approval past its deadline (reason ``expired``)."""
    swept = await ctx.ledger.sweep_approvals()
    if ctx.args.json:
        ctx.out.json([effect_to_record(e) for e in swept.expired])
    else:
        for effect in swept.expired:
            ctx.out.line(
                f"expired {visible(effect.tool)} ({effect.idem_key[:12]}): nobody decided "
                "before its deadline, so it is denied"
            )
        if not swept.expired:
            ctx.out.line("no approval is past its deadline")
    return EXIT_OK


async def cmd_resolve(ctx: Context) -> int:
    args = ctx.args
    if (args.result is None) == (args.error is None):
        raise UsageError("give exactly one of --result JSON (it happened) or --error TEXT")
    effect = await _resolve(ctx)
    if effect is None:
        return EXIT_NOT_DONE
    if args.result is not None:
        try:
            result = orjson.loads(args.result)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"--result is not JSON ({exc}): {args.result!r}") from None
        settle = decide_from_cli(
            ctx.store,
            effect.idem_key,
            DecisionAction.RESOLVE,
            result=result,
            by=args.by,
            note=args.note,
            expected_attempt=args.expected_attempt,
        )
    else:
        settle = decide_from_cli(
            ctx.store,
            effect.idem_key,
            DecisionAction.RESOLVE,
            error=EffectError(args.error, args.code),
            by=args.by,
            note=args.note,
            expected_attempt=args.expected_attempt,
        )
    try:
        moved = await settle
    except DecisionRefusedError as exc:
        print(f"agent-ledger: {exc}", file=sys.stderr)
        return EXIT_NOT_DONE
    except EffectLedgerValidationError as exc:
        if exc.field != "idem_key":
            raise  # bad input: a usage error
        key = effect.idem_key[:12]
        if effect.status is EffectStatus.REQUIRES_APPROVAL and not effect.parked:
            # The library's message names its Python calls; here, the commands.
            print(
                f"agent-ledger: cannot resolve {key}: {visible(effect.tool)} waits for an "
                "approval, not because an attempt's outcome is unknown; its handler never "
                f"ran, so there is nothing to resolve. Decide it with `agent-ledger approve "
                f"{key}` or `agent-ledger deny {key}`. Nothing changed.",
                file=sys.stderr,
            )
        else:
            print(f"agent-ledger: cannot resolve {key}: {exc}", file=sys.stderr)
        return EXIT_NOT_DONE
    return _settled(ctx, effect, "resolve", moved, await ctx.ledger.get_effect(effect.id))


async def _resolve(ctx: Context) -> Effect | None:
    effect = await ctx.ledger.lookup(ctx.args.ref)
    if effect is None:
        print(f"agent-ledger: no effect matches {ctx.args.ref!r}", file=sys.stderr)
    return effect


async def cmd_show(ctx: Context) -> int:
    effect = await _resolve(ctx)
    if effect is None:
        return EXIT_NOT_DONE
    if ctx.args.json:
        ctx.out.json(effect_to_record(effect))
    else:
        ctx.out.line(render_receipt(effect))
    return EXIT_OK


async def _decide(ctx: Context, verb: str, act: Callable[[str], Any]) -> int:
    effect = await _resolve(ctx)
    if effect is None:
        return EXIT_NOT_DONE
    try:
        moved = await act(effect.idem_key)
    except DecisionRefusedError as exc:  # the deadline passed: it is denied as expired
        print(f"agent-ledger: {exc}", file=sys.stderr)
        return EXIT_NOT_DONE
    return _settled(ctx, effect, verb, moved, await ctx.ledger.get_effect(effect.id))


def _settled(ctx: Context, effect: Effect, verb: str, moved: bool, now: Effect | None) -> int:
    after = now or effect
    if ctx.args.json:
        ctx.out.json({"transitioned": moved, "effect": effect_to_record(after)})
    elif moved:
        ctx.out.line(f"{effect.tool} ({effect.idem_key[:12]}) is now {after.status.value}")
    else:
        state = after.status.value
        expected = getattr(ctx.args, "expected_attempt", None)
        if expected is not None and after.attempt != expected:
            state += f" at attempt {after.attempt}, not {expected}"
        print(f"agent-ledger: cannot {verb} {effect.idem_key[:12]}: it is {state}", file=sys.stderr)
    return EXIT_OK if moved else EXIT_NOT_DONE


async def cmd_decide(ctx: Context) -> int:
    """``approve`` and ``deny``: one path, the subcommand names the decision."""
    args = ctx.args

    async def act(key: str) -> bool:
        if args.command == "approve":
            action, note = DecisionAction.APPROVE, args.note
        else:
            action, note = DecisionAction.DENY, args.reason
        return await decide_from_cli(
            ctx.store,
            key,
            action,
            by=args.by or _os_user(),
            note=note,
            expected_attempt=args.expected_attempt,
        )

    return await _decide(ctx, args.command, act)


async def cmd_cancel(ctx: Context) -> int:
    args = ctx.args
    return await _decide(
        ctx, "cancel", lambda key: ctx.ledger.cancel(key, reason=args.reason, by=args.by)
    )


async def cmd_retry(ctx: Context) -> int:
    args = ctx.args
    effect = await _resolve(ctx)
    if effect is None:
        return EXIT_NOT_DONE
    key = effect.idem_key[:12]
    try:
        moved = await ctx.ledger.reopen(effect.idem_key, by=args.by, reason=args.reason)
    except EffectLedgerValidationError as exc:
        if exc.field != "idem_key":
            raise  # bad --by or --reason: a usage error
        # Succeeded or denied: never reopened, and the error says why.
        print(f"agent-ledger: cannot retry {key}: {exc}", file=sys.stderr)
        return EXIT_NOT_DONE
    after = await ctx.ledger.get_effect(effect.id) or effect
    if args.json:
        ctx.out.json({"transitioned": moved, "effect": effect_to_record(after)})
    elif moved:
        ctx.out.line(
            f"{effect.tool} ({key}) is now {after.status.value}: "
            "the next call with its key runs it again"
        )
    else:
        print(
            f"agent-ledger: cannot retry {key}: it is {after.status.value}; only a failed "
            "or canceled effect can be retried",
            file=sys.stderr,
        )
    return EXIT_OK if moved else EXIT_NOT_DONE


async def cmd_review(ctx: Context) -> int:
    from agent_ledger.review import read_line, review

    await review(ctx.ledger, by=ctx.args.by, ask=read_line, say=ctx.out.line)
    return EXIT_OK


async def cmd_export(ctx: Context) -> int:
    args = ctx.args
    if args.decision_attempts:
        return await _export_attempts(ctx)
    filters = _filters(args)
    effects: list[Effect] = []
    cursor: str | None = None
    while True:
        page = await ctx.ledger.list_effects(**filters, limit=1_000, cursor=cursor)
        effects += page.effects
        cursor = page.next_cursor
        if cursor is None:
            break
    if args.format == "md":
        text = render_report(effects, generated_at=datetime.now(UTC), filters=_given(args))
    else:
        text = _format_export([effect_to_record(e) for e in effects], args.format)
    return await _write_export(ctx, text, _count(len(effects), "effect"))


async def _export_attempts(ctx: Context) -> int:
    """``export --decision-attempts``: the decision audit trail (schema version 4),
    oldest first, every attempt accepted or refused, in JSON, JSON lines or CSV."""
    args = ctx.args
    if args.format == "md":
        raise UsageError("--decision-attempts writes json, jsonl or csv, not md")
    from agent_ledger.deciding import approval_store

    rows = [a.to_json() for a in await approval_store(ctx.store).decision_attempts(limit=10**9)]
    if args.format == "json":
        text = orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n"
    elif args.format == "jsonl":
        text = "".join(orjson.dumps(r).decode() + "\n" for r in rows)
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        columns = list(rows[0]) if rows else _ATTEMPT_COLUMNS
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row[c] is None else row[c] for c in columns])
        text = buffer.getvalue()
    return await _write_export(ctx, text, _count(len(rows), "decision attempt"))


async def _write_export(ctx: Context, text: str, what: str) -> int:
    """An export's ``text`` to standard output, or to ``--output`` (then saying
    on standard error how much, ``what``, went where)."""
    output = ctx.args.output
    if output in (None, "-"):
        ctx.out.stream.write(text)
    else:
        await asyncio.to_thread(_write_file, output, text)
        print(f"exported {what} to {output}", file=sys.stderr)
    return EXIT_OK


#: The audit trail's CSV header when it is empty.
_ATTEMPT_COLUMNS: Final = [
    "id", "idem_key", "principal", "channel", "action", "outcome", "reason_code",
    "intent_hash", "note", "at",
]  # fmt: skip


async def cmd_console(ctx: Context) -> int:
    """Serve the approval console (agent_ledger.console) with uvicorn until stopped."""
    args = ctx.args
    try:
        import uvicorn

        from agent_ledger.console import ProxyHeaderAuth, StaticUsers, ToolPatterns, create_app
    except ImportError:
        raise UsageError('the console needs its extra: pip install -e ".[console]"') from None
    if (args.users is None) == (args.proxy_header is None):
        raise UsageError("give exactly one of --users FILE or --proxy-header NAME")
    authenticate: Any
    if args.users is not None:
        try:
            users = orjson.loads(await asyncio.to_thread(Path(args.users).read_bytes))
        except (OSError, orjson.JSONDecodeError) as exc:
            raise UsageError(f"cannot read --users {args.users}: {exc}") from None
        if not isinstance(users, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in users.items()
        ):
            raise UsageError("--users must be a JSON object of user name -> password hash")
        authenticate = StaticUsers(users)
    else:
        if not args.trusted_proxy:
            raise UsageError("--proxy-header needs --trusted-proxy ADDRESS (repeatable)")
        proxy_secret = os.environ.get(PROXY_SECRET_ENV) if args.proxy_secret_header else None
        if args.proxy_secret_header and not proxy_secret:
            raise UsageError(
                f"--proxy-secret-header needs the proxy's secret in ${PROXY_SECRET_ENV}"
            )
        try:
            authenticate = ProxyHeaderAuth(
                header=args.proxy_header,
                trusted_proxies=args.trusted_proxy,
                secret_header=args.proxy_secret_header,
                secret=proxy_secret,
            )
        except ValueError as bad:
            raise UsageError(str(bad)) from None
    rules: dict[str, list[str]] = {}
    for rule in args.allow or []:
        who, sep, pattern = rule.partition(":")
        if not sep or not who or not pattern:
            raise UsageError(f"--allow takes PRINCIPAL:TOOL_PATTERN, got {rule!r}")
        rules.setdefault(who, []).append(pattern)
    if not rules:
        raise UsageError("say who may decide what: --allow PRINCIPAL:TOOL_PATTERN (repeatable)")
    secret_text = os.environ.get(CONSOLE_SECRET_ENV, "")
    if secret_text and len(secret_text.encode()) < 32:
        raise UsageError(f"${CONSOLE_SECRET_ENV} must be at least 32 bytes")
    import secrets

    secret = secret_text.encode() if secret_text else secrets.token_bytes(32)
    app = create_app(
        ctx.ledger,
        authenticate=authenticate,
        authorize=ToolPatterns(rules),
        secret=secret,
        separation_of_duty=args.separation_of_duty,
        allowed_origins=[_origin(url) for url in args.allowed_origin or []],
    )
    print(f"approval console on http://{args.host}:{args.port}/", file=sys.stderr)
    # proxy_headers=False: uvicorn would otherwise take the client's address from
    # X-Forwarded-For when the peer is 127.0.0.1, letting any local process pose as
    # the trusted proxy; ProxyHeaderAuth must see the real peer.
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=args.host, port=args.port, log_level="warning", proxy_headers=False
        )
    )
    await server.serve()
    return EXIT_OK


def _origin(url: str) -> str:
    """``--allowed-origin``'s value as a browser's Origin header spells it."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise UsageError(
            f"--allowed-origin takes an origin such as https://approvals.example.com "
            f"(scheme and host, optionally a port; no path), got {url!r}"
        )
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise UsageError(f"--allowed-origin takes just scheme://host[:port], got {url!r}")
    host = parts.netloc.lower()
    default = {"http": ":80", "https": ":443"}[parts.scheme]
    return f"{parts.scheme}://{host.removesuffix(default)}"  # browsers omit a default port


#: Where ``agent-ledger console`` reads its signing secret (CSRF tokens, links).
CONSOLE_SECRET_ENV: Final = "AGENT_LEDGER_CONSOLE_SECRET"
PROXY_SECRET_ENV: Final = "AGENT_LEDGER_CONSOLE_PROXY_SECRET"


def _given(args: argparse.Namespace) -> dict[str, str]:
    """The filters given on the command line, for the report's header."""
    given: dict[str, str] = {}
    for name, value in _filters(args).items():
        if isinstance(value, timedelta):
            value = format_duration(value)  # exact, and a form --min-duration reads
        elif isinstance(value, datetime):
            value = value.isoformat()
        if value is not None:
            given["--" + {"workflow_id": "workflow"}.get(name, name).replace("_", "-")] = value
    return given


def _write_file(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8", newline="") as file:
            file.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _check_before_opening(args: argparse.Namespace) -> None:
    """Usage errors that need no store, reported before one is opened (or created).

    ``init`` and ``demo`` create the SQLite file's folder only when told
    (``--create-dirs``), and say so; other commands on a missing file say to
    run ``init``.
    """
    if args.command == "review":
        if not sys.stdin.isatty():
            raise UsageError(
                "review asks a person at a terminal, and stdin is not one; in scripts use "
                "`agent-ledger pending` with `approve`/`deny`"
            )
        if args.by is None:
            args.by = _os_user()
    output = getattr(args, "output", None)
    if output not in (None, "-"):
        target = Path(output)
        if target.is_dir():
            raise UsageError(f"--output {output} is a directory; name a file inside it")
        if not target.parent.is_dir():
            raise UsageError(f"--output {output}: the folder {target.parent} does not exist")
    if args.command in ("init", "demo"):
        folder = sqlite_folder(args.url)
        if folder is not None and not folder.is_dir():
            # A typo in a path must not quietly become a new folder.
            if not args.create_dirs:
                raise UsageError(
                    f"the folder {folder} does not exist (from {args.url}); check the path, "
                    "or add --create-dirs to create it"
                )
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot create {folder}: {exc.strerror or exc}") from None
            print(f"agent-ledger: created the folder {folder}", file=sys.stderr)


#: ``--by`` of the deciding commands: who the audit trail names.
BY_HELP: Final = (
    "(kept on the receipt, and the principal of the decision audit trail; default: your "
    "OS user name. The CLI trusts the process that runs it, as its database credentials do)"
)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        raise UsageError("cannot tell who you are from the OS; give --by NAME") from None


def _format_export(records: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(records, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "jsonl":
        return "".join(orjson.dumps(r).decode() + "\n" for r in records)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(RECORD_FIELDS)
    for record in records:
        writer.writerow(csv_cells(record))
    return buffer.getvalue()


#: Columns holding JSON values; CSV writes them as JSON text.
CSV_JSON_COLUMNS: Final = frozenset({"args", "resource", "result", "history", "usage"})


def csv_cells(record: dict[str, Any]) -> list[str]:
    """One CSV row: JSON columns as JSON text, other nulls as empty cells."""
    cells = []
    for name in RECORD_FIELDS:
        value = record[name]
        if name in CSV_JSON_COLUMNS:
            cells.append(orjson.dumps(value).decode())
        else:
            cells.append("" if value is None else str(value))
    return cells


async def cmd_stats(ctx: Context) -> int:
    stats = await ctx.ledger.stats()
    store = ctx.store
    budgets = (
        await store.list_budgets(limit=STATS_BUDGETS) if isinstance(store, BudgetStore) else []
    )
    if ctx.args.json:
        ctx.out.json(
            {
                "total": stats.total,
                "duplicates": stats.duplicates,
                "by_status": {s.value: n for s, n in stats.by_status.items()},
                "by_tool": dict(stats.by_tool),
                "budgets": [state.to_json() for state in budgets],
            }
        )
        return EXIT_OK
    ctx.out.line(
        f"{_count(stats.total, 'effect')}, "
        # Not "answered from receipts": a repeat may have waited for, or even
        # run, an effect that was pending approval when it first arrived.
        f"{_count(stats.duplicates, 'repeated call')} found an existing effect"
    )
    ctx.out.line()
    width = max(len(s.value) for s in EffectStatus)
    for status, count in stats.by_status.items():
        ctx.out.line(f"  {ctx.out.status(status, width)}  {count:>8}")
    if stats.by_tool:
        ctx.out.line()
        tool_width = min(max(len(t) for t in stats.by_tool), WIDTH - 14)
        for tool, count in sorted(stats.by_tool.items(), key=lambda item: (-item[1], item[0])):
            ctx.out.line(f"  {_clip(tool, tool_width).ljust(tool_width)}  {count:>8}")
    if budgets:
        ctx.out.line()
        ctx.out.line("spend by workflow (budgets, most recently changed first):")
        name_width = min(max(len(b.workflow_id) for b in budgets), 40)
        for state in budgets:
            spent, limit = state.spent, state.limits
            of = "" if limit.usd is None else f" of {_amount(limit.usd, 'usd')}"
            ctx.out.line(
                f"  {_clip(visible(state.workflow_id), name_width).ljust(name_width)}  "
                f"{_amount(spent.usd, 'usd')}{of}, "
                f"{spent.input_tokens:,} in / {spent.output_tokens:,} out tokens, "
                f"{_count(spent.tool_calls, 'tool call')}"
            )
    return EXIT_OK


async def cmd_purge(ctx: Context) -> int:
    args = ctx.args
    older_than = parse_duration(args.older_than)
    statuses = frozenset(EffectStatus(s) for s in args.status) if args.status else TERMINAL
    names = ", ".join(sorted(s.value for s in statuses))
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(
                f"purge deletes {names} effects completed over {args.older_than} ago; "
                "add --yes to confirm"
            )
        question = f"Delete {names} effects completed over {args.older_than} ago? [y/N] "
        answer = await asyncio.to_thread(input, question)
        if answer.strip().lower() not in ("y", "yes"):
            ctx.out.line("nothing deleted")
            return EXIT_NOT_DONE
    removed = await ctx.ledger.purge(older_than, statuses)
    if args.json:
        ctx.out.json({"removed": removed})
    else:
        ctx.out.line(f"removed {_count(removed, 'effect')}")
    return EXIT_OK


async def cmd_import_02(ctx: Context) -> int:
    from agent_ledger.legacy.importer import import_legacy

    args = ctx.args
    report = await import_legacy(args.source, args.url, schema=args.schema, dry_run=args.dry_run)
    if args.json:
        ctx.out.json(report.as_json())
    else:
        done = "would import" if report.dry_run else "imported"
        ctx.out.line(f"read {_count(report.read, 'row')} from the 0.2.x table {report.source}")
        ctx.out.line(
            f"{done} {report.imported}, skipped {report.skipped} (already imported), "
            f"collisions {len(report.collisions)}, unreadable {len(report.unreadable)}, "
            f"inexact results {len(report.inexact_results)}, "
            f"{'would update' if report.dry_run else 'updated'} {len(report.updated)}, "
            f"conflicts {len(report.conflicts)}"
        )
        for status, count in sorted(report.by_status.items()):
            ctx.out.line(f"  {status:<17}  {count:>8}")
        for line in report.updated:
            ctx.out.line(f"{'would update' if report.dry_run else 'updated'}: {line}")
        for line in report.conflicts:
            ctx.out.line(f"conflict: {line}")
        for line in report.collisions:
            ctx.out.line(f"collision: {line}")
        for line in report.unreadable:
            ctx.out.line(f"unreadable: {line}")
        for effect_id in report.inexact_results:
            ctx.out.line(
                f"inexact result: effect {effect_id} replays an integer beyond 64 bits "
                "as a float (see docs/migrating-from-0.2.md)"
            )
        if report.dry_run:
            ctx.out.line("dry run: nothing written")
    return EXIT_OK


# -- parser and entry point -------------------------------------------------------------


def _argument(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """Adapt a parser so argparse reports its error as a usage error (exit 2)."""

    def convert(text: str) -> _T:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _duration_text(text: str) -> str:
    parse_duration(text)
    return text


URL_HELP: Final = (
    f"memory://, sqlite:///PATH, postgresql://... or mysql://... (default: ${URL_ENV}, "
    "else sqlite:///./agent_ledger.db)"
)


class _Parser(argparse.ArgumentParser):
    """argparse, reporting a usage error like every other error: one line on
    stderr with the ``agent-ledger:`` prefix, and where to read more (its
    default is the whole usage block, then ``PROG: error: ...``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"agent-ledger: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="agent-ledger",
        description="Inspect and decide effects in an agent-ledger store.",
        epilog=f"The store URL defaults to ${URL_ENV}, else sqlite:///./agent_ledger.db.",
    )
    parser.add_argument("--version", action="version", version=f"agent-ledger {__version__}")
    parser.add_argument("--url", default=None, help=URL_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[Context], Any], help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_)
        sub.set_defaults(run=run)
        # Accepted after the command too (`agent-ledger list --url ...`); SUPPRESS
        # keeps an absent one from overwriting a --url given before the command.
        sub.add_argument("--url", default=argparse.SUPPRESS, help=URL_HELP)
        if name not in ("init", "demo", "export", "review"):
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        return sub

    def filters(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--workflow", help="only this workflow id")
        sub.add_argument("--tool", help="only this tool")
        sub.add_argument("--status", choices=[s.value for s in EffectStatus])
        sub.add_argument(
            "--since",
            type=_argument(parse_moment),
            help="created at or after: ISO time, or a duration ago (2h)",
        )
        sub.add_argument(
            "--until",
            type=_argument(parse_moment),
            help="created before: ISO time, or a duration ago",
        )
        sub.add_argument("--call-id", help="only this call id (exact)")
        sub.add_argument("--error-code", help="only this error code (exact), e.g. handler_timeout")
        for bound, which in (("min", "at least"), ("max", "at most")):
            sub.add_argument(
                f"--{bound}-duration",
                type=_argument(parse_duration),
                metavar="DURATION",
                help=f"handler time {which} this (500ms, 2s, 1m30s), never approval wait",
            )

    create_dirs_help = "create the SQLite file's missing folders (else a missing one is an error)"
    sub = command("init", cmd_init, "create the store's tables (idempotent)")
    sub.add_argument("--create-dirs", action="store_true", help=create_dirs_help)
    sub.add_argument(
        "--partitioned", action="store_true",
        help="PostgreSQL: partition the effects table by time (converts an existing one, "
        "locking it meanwhile; see docs/postgres.md)",
    )  # fmt: skip
    sub.add_argument(
        "--period", choices=["day", "week", "month"], default="month",
        help="with --partitioned: how long one partition spans (default: month)",
    )  # fmt: skip
    sub.add_argument(
        "--roles", action="store_true",
        help="PostgreSQL: create or update the owner/worker/approver roles and the triggers "
        "that let only approvers decide (re-run after upgrades; see docs/postgres.md)",
    )  # fmt: skip
    sub.add_argument(
        "--role-prefix", metavar="PREFIX",
        help="with --roles: the roles are PREFIXowner, PREFIXworker, PREFIXapprover "
        "(default: agent_ledger_)",
    )  # fmt: skip
    sub.add_argument(
        "--separate-duty", action=argparse.BooleanOptionalAction, default=None,
        help="with --roles: the database refuses a decision by the role that asked for it "
        "(default: keep the schema's setting; off at first)",
    )  # fmt: skip
    command(
        "migrate",
        cmd_migrate,
        "upgrade the store's tables to this version of agent-ledger (idempotent)",
    )
    sub = command(
        "demo", cmd_demo,
        "an agent retries a payment 5 times and it is charged once; then a saga rolls back",
    )  # fmt: skip
    sub.add_argument(
        "which", nargs="?", choices=["all", "payment", "saga"], default="all",
        help="payment: only the retried payment and its refund; saga: only the saga "
        "whose shipping step fails and is rolled back (default: both)",
    )  # fmt: skip
    sub.add_argument("--create-dirs", action="store_true", help=create_dirs_help)
    sub = command("sagas", cmd_sagas, "sagas: list them, show one's steps, recover stuck ones")
    from agent_ledger.saga_commands import add_arguments

    add_arguments(sub)
    sub = command("list", cmd_list, "effects, newest first")
    filters(sub)
    sub.add_argument("--limit", type=int, default=50)
    sub.add_argument("--cursor", help="continue after a previous page")
    sub = command("show", cmd_show, "one effect's full receipt")
    sub.add_argument("ref", metavar="IDEM_KEY_OR_ID", help="id, key, or a key prefix (8+ chars)")
    sub = command(
        "pending",
        cmd_pending,
        "effects waiting for a person: approvals, and ambiguous attempts (parked)",
    )
    sub.add_argument("--limit", type=int, default=100)
    ref_help = "the effect: its id, its key, or a key prefix (8+ chars)"
    expected_help = "the attempt you saw (pending's ATT): refused if the effect has moved on since"
    sub = command(
        "review", cmd_review, "decide pending approvals one by one, oldest first (interactive)"
    )
    sub.add_argument("--by", help="who decides (kept on each receipt; default: your OS user name)")
    sub = command("approve", cmd_decide, "approve a pending effect")
    sub.add_argument("ref", metavar="KEY", help=ref_help)
    sub.add_argument("--by", help="who approves " + BY_HELP)
    sub.add_argument("--note", help="why (kept on the receipt)")
    sub.add_argument("--expected-attempt", type=int, metavar="N", help=expected_help)
    sub = command("deny", cmd_decide, "deny a pending effect")
    sub.add_argument("ref", metavar="KEY", help=ref_help)
    sub.add_argument("--reason", help="why not (kept on the receipt; callers see it)")
    sub.add_argument("--by", help="who denies " + BY_HELP)
    sub.add_argument("--expected-attempt", type=int, metavar="N", help=expected_help)
    sub = command(
        "resolve",
        cmd_resolve,
        "settle a parked effect with what happened downstream (callers get it as the receipt)",
    )
    sub.add_argument("ref", metavar="KEY", help=ref_help)
    sub.add_argument("--result", metavar="JSON", help="it happened: the provider's result")
    sub.add_argument("--error", metavar="TEXT", help="it failed: why (recorded as failed)")
    sub.add_argument("--code", help="the error's code, with --error (e.g. card_declined)")
    sub.add_argument("--by", required=True, help="who resolves it (kept on the receipt)")
    sub.add_argument("--note", help="what you checked (kept on the receipt)")
    sub.add_argument("--expected-attempt", type=int, metavar="N", help=expected_help)
    command(
        "sweep",
        cmd_sweep,
        "deny every approval past its deadline (expired); escalation hooks run in your "
        "process's ledger.sweep_approvals()",
    )
    command(
        "park-stale",
        cmd_park_stale,
        "park every ambiguous attempt now (on_stale='park' runs whose worker went silent)",
    )
    sub = command("cancel", cmd_cancel, "cancel an effect that has not finished")
    sub.add_argument("ref", metavar="KEY", help=ref_help)
    sub.add_argument("--reason", help="why (kept on the receipt; callers see it)")
    sub.add_argument("--by", help="who cancels (kept on the receipt)")
    sub = command(
        "retry", cmd_retry, "send a failed or canceled effect back, to run again on its next call"
    )
    sub.add_argument("ref", metavar="KEY", help=ref_help)
    sub.add_argument("--by", required=True, help="who retries it (kept on the receipt)")
    sub.add_argument("--reason", required=True, help="why (kept on the receipt)")
    sub = command(
        "export", cmd_export, "write effects as JSON, JSON lines, CSV or a Markdown report"
    )
    filters(sub)
    sub.add_argument(
        "--format",
        choices=["json", "jsonl", "csv", "md"],
        default="jsonl",
        help="md: a Markdown incident report (summary, failures first, one section per effect)",
    )
    sub.add_argument("-o", "--output", help="file to write (default: stdout)")
    sub.add_argument(
        "--decision-attempts",
        action="store_true",
        help="write the decision audit trail (every attempt, accepted or refused) instead",
    )
    sub = command("console", cmd_console, "serve the approval console (needs the console extra)")
    sub.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sub.add_argument("--port", type=int, default=8000)
    sub.add_argument("--users", metavar="FILE", help="JSON {user: password hash} (HTTP Basic)")
    sub.add_argument("--proxy-header", metavar="NAME", help="the trusted proxy's user header")
    sub.add_argument(
        "--trusted-proxy", action="append", metavar="ADDRESS", help="proxy address or network"
    )
    sub.add_argument(
        "--proxy-secret-header",
        metavar="HEADER",
        help="header carrying the proxy's secret ($AGENT_LEDGER_CONSOLE_PROXY_SECRET)",
    )
    sub.add_argument(
        "--allow", action="append", metavar="PRINCIPAL:PATTERN", help="who may decide which tools"
    )
    sub.add_argument(
        "--separation-of-duty",
        action="store_true",
        help="refuse a decision by the principal who asked for the approval",
    )
    sub.add_argument(
        "--allowed-origin",
        action="append",
        metavar="URL",
        help="another origin whose POSTs are accepted, e.g. the public https://host of a proxy",
    )
    command("stats", cmd_stats, "counts by status and tool, and spend by workflow")
    sub = command("budget", cmd_budget, "a workflow's budget: limits, spent, reserved, remaining")
    sub.add_argument("action", choices=["show"])
    sub.add_argument("workflow_id", metavar="WORKFLOW_ID")
    sub = command("purge", cmd_purge, "delete old finished effects")
    sub.add_argument(
        "--older-than", required=True, type=_argument(_duration_text), help="e.g. 30d, 12h"
    )
    sub.add_argument(
        "--status",
        action="append",
        choices=sorted(s.value for s in TERMINAL),
        help="only these terminal statuses (repeatable; default: all terminal)",
    )
    sub.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sub = command("import-0.2", cmd_import_02, "import an agent-ledger 0.2.x table (idempotent)")
    sub.add_argument("--from", dest="source", required=True, help="the 0.2.x postgresql:// URL")
    sub.add_argument("--schema", help="the 0.2.x table's schema (default: public)")
    sub.add_argument("--dry-run", action="store_true", help="check and count, write nothing")
    return parser


@contextmanager
def _signals_wake_the_loop() -> Iterator[None]:
    """Make a signal wake the event loop, whichever thread the kernel gives it to.

    asyncio.run's SIGINT handler (cancel the main task) runs on the main thread,
    and only once the main thread runs Python code. The kernel may deliver
    Ctrl-C's SIGINT to any thread (the prompt's reader, a store's worker): then
    nothing interrupts the main thread's wait in select, and the command would
    hang until the next Enter. Python's C-level handler, on whichever thread,
    writes the signal to the wakeup fd; reading it wakes the loop, and the
    main thread then runs the handler. Only on the main thread (where signal
    handlers live), so ``main()`` called on another thread is unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)

    def drain() -> None:
        with suppress(OSError):
            reader.recv(4096)

    loop.add_reader(reader.fileno(), drain)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()


async def _dispatch(args: argparse.Namespace, out: Output) -> int:
    with _signals_wake_the_loop():
        return await _dispatch_woken(args, out)


async def _dispatch_woken(args: argparse.Namespace, out: Output) -> int:
    creating = args.command in ("init", "demo")
    store = await open_store(args.url, create=creating)
    try:
        # init and demo create the schema; migrate upgrades it (opened without
        # create, so SQLite has not upgraded it on opening and the report says
        # what migrate did); every other command checks it first, so a missing
        # or old schema is one clear line (Store protocol steps).
        if creating:
            await store.create_schema()
        elif args.command != "migrate":
            await store.check_schema()
        ledger = EffectLedger(EffectLedgerOptions(store=store))
        result: int = await args.run(Context(args, store, ledger, out))
        return result
    finally:
        await store.close()


def _say(message: str, hint: str = "") -> None:
    """An error as exactly one line on stderr: its first line, then ``hint``.

    A store error can carry the driver's whole text (psycopg's ``LINE 1:``
    and caret under a failed statement, libpq's "Is the server running?");
    its first line says what failed, the rest only where.
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    print(f"agent-ledger: {lines[0] if lines else 'failed'}{hint}", file=sys.stderr)


#: Store errors about the URL itself: opening, connecting, the schema found there.
_URL_OPERATIONS: Final = frozenset({"open", "connect", "check_schema"})


def _url_hint(args: argparse.Namespace, exc: Exception) -> str:
    """Where the failing URL came from, when it was not typed on this command line,
    and why a SQLite file could not be opened when its folder is read-only."""
    about_url = (isinstance(exc, EffectLedgerValidationError) and exc.field == "url") or (
        isinstance(exc, EffectStoreError) and exc.operation in _URL_OPERATIONS
    )
    if not about_url:
        return ""
    hint = ""
    folder = sqlite_folder(args.url)
    if isinstance(exc, EffectStoreError) and folder is not None and folder.is_dir():
        path = Path(args.url[len("sqlite:///") :])
        if not os.access(folder, os.W_OK):
            hint += (
                f"; the folder {folder} is read-only for you, and SQLite writes there "
                "(the database and its -wal and -shm files)"
            )
        elif path.exists() and not os.access(path, os.W_OK):
            hint += f"; the file {path} is read-only for you"
    if args.url_from_env:
        hint += f" (the URL came from ${URL_ENV}; --url overrides it)"
    return hint


def _preparse(argv: Sequence[str]) -> None:
    """Catch what argparse would misreport: ``--since -2h`` reads as two options."""
    for option, value in itertools.pairwise(argv):
        signed = value[:1] in ("-", "+") and bool(_duration_parts(value[1:]))
        if option in ("--since", "--until") and signed:
            raise UsageError(
                f"{option} {value}: a duration is always ago and takes no sign: "
                f"{option} {value[1:]} means {value[1:]} ago"
            )


@contextmanager
def _library_logs_quiet() -> Iterator[None]:
    """The library's log records stay out of the CLI's output, unless logging is set up.

    With no handler anywhere, Python prints warnings to stderr ("effect
    parked by a sweep: ..."); the command already says what happened, in
    its own words.
    """
    library = logging.getLogger("agent_ledger")
    quiet = logging.NullHandler()
    if not logging.getLogger().handlers and not library.handlers:
        library.addHandler(quiet)
    try:
        yield
    finally:
        library.removeHandler(quiet)


def main(argv: Sequence[str] | None = None, stdout: IO[str] | None = None) -> int:
    """Entry point of the ``agent-ledger`` console script."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _preparse(argv)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE
    args = parser.parse_args(argv)
    args.url_from_env = args.url is None and bool(os.environ.get(URL_ENV))
    args.url = args.url or default_url()
    stream = stdout if stdout is not None else sys.stdout
    colour = stream.isatty() and not os.environ.get("NO_COLOR")
    try:
        _check_before_opening(args)
        with _library_logs_quiet():
            return asyncio.run(_dispatch(args, Output(stream, colour)))
    except (UsageError, EffectLedgerValidationError) as exc:
        _say(str(exc), _url_hint(args, exc))
        return EXIT_USAGE
    except EffectStoreError as exc:
        _say(str(exc), _url_hint(args, exc))
        return EXIT_NOT_DONE
    except EffectLedgerError as exc:
        _say(f"{type(exc).__name__}: {exc}")
        return EXIT_NOT_DONE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
