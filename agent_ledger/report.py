"""An incident report in Markdown: what the agent did, for a person and a ticket.

``agent-ledger export --format md`` renders the selected effects as one
document: a summary (how many, the time span they were created in, counts
by status and by tool, and the failures listed first), then one section per
effect with its receipt, the decision a person made and the error.

Everything an agent or a tool chose (args, results, error messages, tool and
workflow names, notes) is shown as code: inline code spans in lists and
tables, fenced blocks for anything longer or multi-line, each fence longer
than any run of backticks inside, so no value can close its fence, start a
heading, inject HTML or break a table, however it is written. Control
characters other than newlines and tabs are shown as ``\\xNN``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

import orjson

from agent_ledger.effects import (
    Effect,
    HistoryEvent,
    JSONValue,
    Parked,
    RetryableFailure,
    Scoped,
    Settlement,
    TryFailure,
    handler_time,
)
from agent_ledger.status import EffectStatus

__all__ = ["FAILURES", "render_report"]

#: The outcomes a report lists first, worst first: the side effect did not
#: happen as asked (failed), may or may not have happened (canceled), or was refused.
FAILURES: Final = (EffectStatus.FAILED, EffectStatus.CANCELED, EffectStatus.DENIED)
#: Then the rest, in the order a person looks at them: still open, then done.
_OTHERS: Final = (
    EffectStatus.PROCESSING,
    EffectStatus.REQUIRES_APPROVAL,
    EffectStatus.READY,
    EffectStatus.SUCCEEDED,
)
#: What must never reach a reader raw: C0 controls but newline and tab, DEL, the C1
#: controls (U+009B is a terminal's CSI) and the bidirectional marks and overrides
#: (U+202E would show the text after it reversed). Printed as escapes instead.
_CONTROL: Final = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
_TICKS: Final = re.compile(r"`+")


def render_report(
    effects: Iterable[Effect],
    *,
    generated_at: datetime,
    filters: Mapping[str, str] | None = None,
) -> str:
    """The Markdown report of ``effects`` (those a filtered listing selected).

    ``generated_at`` is also the "now" of running effects' handler time;
    ``filters`` (name to value, as the user gave them) are named in the
    header so a reader knows what the report covers.
    """
    chosen = _ordered(effects)
    lines = ["# Incident report: agent-ledger effects", ""]
    lines.append(f"Generated {_stamp(generated_at)}.")
    if filters:
        given = ", ".join(f"{name} {_code(value)}" for name, value in filters.items())
        lines.append(f"Selected by {given}.")
    else:
        lines.append("Every effect in the ledger.")
    lines += ["", "## Summary", ""]
    lines += _summary(chosen, generated_at)
    lines += ["", "## Effects", ""]
    if not chosen:
        lines.append("No effect matches.")
    for number, effect in enumerate(chosen, 1):
        lines += _section(number, effect, generated_at)
    return "\n".join(lines).rstrip("\n") + "\n"


def _ordered(effects: Iterable[Effect]) -> list[Effect]:
    """Failures first (failed, canceled, denied), then the rest; newest first within each."""
    rank = {status: i for i, status in enumerate((*FAILURES, *_OTHERS))}
    newest = sorted(effects, key=lambda e: (e.created_at, e.id), reverse=True)
    return sorted(newest, key=lambda e: rank[e.status])


def _summary(effects: Sequence[Effect], now: datetime) -> list[str]:
    if not effects:
        return ["No effect matches."]
    first = min(e.created_at for e in effects)
    last = max(e.created_at for e in effects)
    failures = [e for e in effects if e.status in FAILURES]
    lines = [
        f"- **{_count(len(effects), 'effect')}**, created from {_stamp(first)} "
        f"to {_stamp(last)} ({_span(last - first)}).",
        f"- **{_count(len(failures), 'failure')}** ({', '.join(s.value for s in FAILURES)}).",
    ]
    slowest = max(
        ((took, e) for e in effects if (took := handler_time(e, now)) is not None),
        key=lambda pair: pair[0],
        default=None,
    )
    if slowest is not None:
        took, effect = slowest
        lines.append(
            f"- Longest handler time: {_span(took)}, {_code(effect.tool)} "
            f"([{_ref(effect)}](#{_anchor(effects.index(effect) + 1)}))."
        )
    by_status = Counter(e.status for e in effects)
    lines += ["", "| status | effects |", "| --- | ---: |"]
    for status in (*FAILURES, *_OTHERS):
        if by_status[status]:
            lines.append(f"| {status.value} | {by_status[status]} |")
    tools = sorted({e.tool for e in effects})
    per_tool = Counter((e.tool, e.status) for e in effects)
    shown = [s for s in (*FAILURES, *_OTHERS) if by_status[s]]
    lines += ["", "| tool | " + " | ".join(s.value for s in shown) + " |"]
    lines.append("| --- |" + " ---: |" * len(shown))
    tools.sort(key=lambda t: (-sum(per_tool[t, s] for s in FAILURES), t))
    for tool in tools:
        cells = " | ".join(str(per_tool[tool, s]) for s in shown)
        lines.append(f"| {_cell(tool)} | {cells} |")
    lines += ["", "### Failures", ""]
    if not failures:
        lines.append("None.")
    for number, effect in enumerate(effects, 1):
        if effect.status not in FAILURES:
            break  # failures come first
        error = effect.error
        why = "" if error is None else f": {_code(_one_line(str(error), 120))}"
        lines.append(
            f"{number}. **{effect.status.value}** {_code(effect.tool)} "
            f"([{_ref(effect)}](#{_anchor(number)})){why}"
        )
    return lines


def _section(number: int, effect: Effect, now: datetime) -> list[str]:
    lines = [
        f'<a id="{_anchor(number)}"></a>',
        "",
        f"### {number}. {effect.status.value}: {_code(effect.tool)} ({_ref(effect)})",
        "",
        f"- status: **{effect.status.value}**",
        f"- tool: {_code(effect.tool)}",
        f"- workflow: {_code(effect.workflow_id)}",
    ]
    if effect.call_id is not None:
        lines.append(f"- call id: {_code(effect.call_id)}")
    lines += [
        f"- idempotency key: `{effect.idem_key}`",
        f"- effect id: `{effect.id}`",
        f"- created: {_stamp(effect.created_at)}",
    ]
    if effect.started_at is not None:
        lines.append(f"- started: {_stamp(effect.started_at)}")
    if effect.completed_at is not None:
        lines.append(f"- completed: {_stamp(effect.completed_at)}")
    took = handler_time(effect, now)
    if took is not None:
        running = " so far (still running)" if effect.status is EffectStatus.PROCESSING else ""
        lines.append(f"- handler time: {_span(took)}{running}")
    lines.append(
        f"- runs: {effect.executions}, tries: {effect.tries}, repeated calls: {effect.dedup_count}"
    )
    lines += ["", "**Args**", "", *_block(_json(effect.args), "json")]
    if effect.resource is not None:
        lines += ["", "**Resource**", "", *_block(_json(effect.resource), "json")]
    lines += ["", "**Decision**", ""]
    if effect.decided_by is None and effect.decided_at is None:
        lines.append("None: no person decided on this effect.")
    else:
        who = _code(effect.decided_by) if effect.decided_by is not None else "someone unnamed"
        when = f" at {_stamp(effect.decided_at)}" if effect.decided_at is not None else ""
        lines.append(f"By {who}{when}.")
        if effect.decision_note:
            lines += ["", *_block(effect.decision_note, "text")]
    lines += ["", "**Error**", ""]
    if effect.error is None:
        lines.append("None.")
    else:
        code = effect.error.code
        lines.append(f"Code {_code(code)}:" if code else "No code:")
        lines += ["", *_block(effect.error.message, "text")]
    if effect.status is EffectStatus.SUCCEEDED or effect.result is not None:
        lines += ["", "**Result**", "", *_block(_json(effect.result), "json")]
    if effect.history:
        lines += ["", "**History**", ""]
        for event in effect.history:
            lines.append(f"- {_event(event)}")
    lines.append("")
    return lines


def _event(event: HistoryEvent) -> str:
    if isinstance(event, Parked):
        worker = _code(event.worker) if event.worker else "an unnamed worker"
        return (
            f"{_stamp(event.at)}: parked: attempt {event.attempt}, started "
            f"{_stamp(event.started_at)} by {worker}, went silent after "
            f"{_stamp(event.heartbeat_at)}; outcome unknown"
        )
    if isinstance(event, Settlement):
        who = _code(event.by) if event.by else "someone unnamed"
        note = f": {_code(_one_line(event.note, 200))}" if event.note else ""
        return (
            f"{_stamp(event.at)}: settled as {event.status.value} by {who} "
            f"(attempt {event.attempt}){note}"
        )
    if isinstance(event, TryFailure):
        code = f" {_code(event.code)}" if event.code else ""
        message = _code(_one_line(event.message, 200))
        return f"{_stamp(event.at)}: try {event.number} failed{code}: {message}"
    if isinstance(event, Scoped):
        turn = f", turn {_code(event.turn)}" if event.turn is not None else ""
        call = f", call {_code(event.call_id)}" if event.call_id is not None else ""
        return f"created with scope {event.scope}{turn}{call}"
    if isinstance(event, RetryableFailure):
        code = f" {_code(event.code)}" if event.code else ""
        message = _code(_one_line(event.message, 200))
        return f"{_stamp(event.at)}: attempt {event.attempt} failed retryably{code}: {message}"
    reason = _code(_one_line(event.reason, 200))
    return f"{_stamp(event.at)}: reopened by {_code(event.by)} ({event.status.value}): {reason}"


# -- safe text -----------------------------------------------------------------------


def _visible(text: str) -> str:
    """``text`` with every ``_CONTROL`` character shown as ``\\xNN`` or ``\\uNNNN``
    (a report is read with ``cat`` as often as it is rendered)."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _code(text: str | None) -> str:
    """An inline code span holding ``text`` literally (on one line)."""
    if text is None:
        return "(none)"
    text = _visible(text).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    longest = max((len(run) for run in _TICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    # A space on each side keeps a leading or trailing backtick off the fence
    # (CommonMark strips one space from each side of such a span).
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text: str) -> str:
    """An inline code span for a table cell: a pipe there would end the cell."""
    return _code(text).replace("|", "\\|")


def _block(text: str, info: str) -> list[str]:
    """A fenced code block holding ``text`` literally, fenced longer than any backtick run."""
    text = _visible(text)
    longest = max((len(run) for run in _TICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *text.splitlines(), fence]


def _json(value: JSONValue) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _ref(effect: Effect) -> str:
    return effect.idem_key[:12]


def _anchor(number: int) -> str:
    return f"effect-{number}"


def _stamp(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


def _span(span: timedelta) -> str:
    ms = span / timedelta(milliseconds=1)
    if ms < 1_000:
        return f"{ms:.1f} ms"
    seconds = ms / 1_000
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
