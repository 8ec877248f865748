"""``agent-ledger review``: decide every pending approval in one sitting.

The effects waiting for a person are walked oldest first (the one waiting
longest is the one most likely holding an agent up). Each is shown whole:
tool, workflow, call id, the args pretty-printed, when it was created, how
long it has waited; then the reviewer answers approve, deny (a reason is
required: the caller sees it), skip or quit. Every decision is recorded
with ``by`` (the OS user name unless ``--by`` says otherwise) and the note
or reason.

Another reviewer (or a caller's own timeout, or a cancel) may decide an
effect while it is on screen. Decisions are compare-and-set in the store, so
exactly one lands; the other reviewer is told who decided it and how, and
the walk goes on. The list of effects is read once at the start, and each
effect is read again just before it is shown, so one decided meanwhile is
said to be so and not asked about.

The prompts and answers go through two functions the caller gives (the CLI
reads the terminal in a thread), so this module holds the walk and the
words, not the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import orjson

from agent_ledger.approvals import DecisionAction
from agent_ledger.deciding import decide_from_cli
from agent_ledger.effects import Effect, JSONValue
from agent_ledger.ledger import EffectLedger
from agent_ledger.receipt import visible
from agent_ledger.status import EffectStatus

__all__ = ["ReviewTally", "read_line", "review"]

#: Answers accepted at the question, by what they do.
_ANSWERS: Final = {
    "a": "approve",
    "approve": "approve",
    "d": "deny",
    "deny": "deny",
    "r": "resolve",
    "resolve": "resolve",
    "s": "skip",
    "skip": "skip",
    "": "skip",
    "q": "quit",
    "quit": "quit",
}


@dataclass
class ReviewTally:
    """What one review did."""

    approved: int = 0
    denied: int = 0
    skipped: int = 0
    #: Decided by someone else while this reviewer looked at them.
    taken: int = 0
    #: Quit before the end.
    quit: bool = False

    def __str__(self) -> str:
        parts = [f"{self.approved} approved", f"{self.denied} denied", f"{self.skipped} skipped"]
        if self.taken:
            parts.append(f"{self.taken} decided by someone else")
        return ", ".join(parts)


#: Reads one answer: shows the prompt, returns the line typed (no newline);
#: raises EOFError when the input ends.
Ask = Callable[[str], Awaitable[str]]


async def read_line(prompt: str) -> str:
    """An :data:`Ask` that reads the terminal: ``input()`` on a daemon thread.

    Not the loop's default executor: a thread blocked in ``input()`` cannot be
    stopped, and the executor's threads are joined when the loop closes, so
    Ctrl-C at a prompt would hang until the next Enter. A daemon thread is
    simply left behind when the process exits.
    """
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def settle(line: str | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(line or "")

    def read() -> None:
        try:
            line, error = input(prompt), None
        except BaseException as exc:  # EOFError at Ctrl-D; passed to the reader
            line, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, line, error)

    threading.Thread(target=read, name="agent-ledger-review-input", daemon=True).start()
    return await answer


async def review(
    ledger: EffectLedger,
    *,
    by: str,
    ask: Ask,
    say: Callable[[str], None],
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ReviewTally:
    """Walk the pending approvals oldest first, asking ``ask`` about each."""
    pending = await _all_pending(ledger)
    tally = ReviewTally()
    if not pending:
        say("nothing waits for approval")
        return tally
    waiting = _count(len(pending), "effect")
    say(f"{waiting} waiting for approval, oldest first; deciding as {visible(by)}")
    for number, listed in enumerate(pending, 1):
        effect = await ledger.get_effect(listed.id)
        say("")
        say(f"[{number}/{len(pending)}]")
        if effect is None or effect.status is not EffectStatus.REQUIRES_APPROVAL:
            say(_taken(listed, effect))
            tally.taken += 1
            continue
        say(receipt(effect, now()))
        try:
            done = await _decide(ledger, effect, by=by, ask=ask, say=say, tally=tally)
        except EOFError:  # input ended (Ctrl-D): stop here, as quit does
            done = False
        if not done:
            tally.quit = True
            say("")
            # The one on screen was not decided either: it and every one after it.
            left = len(pending) - number + 1
            say(f"stopped; {_count(left, 'effect')} not reviewed")
            break
    say("")
    say(f"review done: {tally}")
    return tally


async def _decide(
    ledger: EffectLedger,
    effect: Effect,
    *,
    by: str,
    ask: Ask,
    say: Callable[[str], None],
    tally: ReviewTally,
) -> bool:
    """Ask about one effect and record the answer; False when the reviewer quits."""
    key = effect.idem_key
    # A parked effect (an ambiguous attempt) has a third answer: it did happen.
    parked = effect.parked
    prompt, keys = (
        ("[a]pprove (it did not happen: run it again), [r]esolve (it happened: record "
         "the result), [d]eny, [s]kip, [q]uit? ", "a, r, d, s or q")
        if parked
        else ("[a]pprove, [d]eny, [s]kip, [q]uit? ", "a, d, s or q")
    )  # fmt: skip
    while True:
        answer = (await ask(prompt)).strip().lower()
        action = _ANSWERS.get(answer)
        if action is not None and (parked or action != "resolve"):
            break
        say(f"not an answer: '{visible(answer)}'; type {keys}")
    if action == "quit":
        return False
    if action == "skip":
        tally.skipped += 1
        say("skipped: it still waits")
        return True
    # Every decision names the attempt on screen: if the effect moved on
    # meanwhile (another reviewer, a new attempt), nothing is recorded.
    attempt = effect.attempt
    if action == "approve":
        note = (await ask("note (optional, Enter for none): ")).strip() or None
        moved = await decide_from_cli(
            ledger.store, key, DecisionAction.APPROVE, by=by, note=note, expected_attempt=attempt
        )
    elif action == "resolve":
        result = await _ask_result(ask, say)
        note = (await ask("note (optional, Enter for none): ")).strip() or None
        moved = await decide_from_cli(
            ledger.store,
            key,
            DecisionAction.RESOLVE,
            by=by,
            note=note,
            expected_attempt=attempt,
            result=result,
        )
    else:
        reason = ""
        while not reason:
            reason = (await ask("reason (required; the caller sees it): ")).strip()
        moved = await decide_from_cli(
            ledger.store, key, DecisionAction.DENY, by=by, note=reason, expected_attempt=attempt
        )
    if moved:
        if action == "approve":
            tally.approved += 1
            again = " again" if parked else ""
            say(
                f"approved {visible(effect.tool)} ({key[:12]}): the next call with its key "
                f"runs it{again}"
            )
        elif action == "resolve":
            tally.approved += 1
            say(f"resolved {visible(effect.tool)} ({key[:12]}): its callers get that result")
        else:
            tally.denied += 1
            say(f"denied {visible(effect.tool)} ({key[:12]}): its callers get the reason")
        return True
    tally.taken += 1
    say(_taken(effect, await ledger.get_effect(effect.id)))
    return True


async def _ask_result(ask: Ask, say: Callable[[str], None]) -> JSONValue:
    """The provider's result, as JSON, asked until it parses."""
    while True:
        text = (await ask("result as JSON (what the provider says happened): ")).strip()
        try:
            value: JSONValue = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            say(f'not JSON ({visible(str(exc))}); type it again, e.g. {{"charge_id": "ch_1"}}')
            continue
        return value


def _taken(listed: Effect, now: Effect | None) -> str:
    """Why an effect is no longer asked about: someone else decided it (or it is gone)."""
    ref = f"{visible(listed.tool)} ({listed.idem_key[:12]})"
    if now is None:
        return f"{ref} is gone (purged); nothing to decide"
    who = f" by {visible(now.decided_by)}" if now.decided_by else ""
    return f"{ref} was already decided{who}: it is now {now.status.value}; nothing recorded"


def receipt(effect: Effect, now: datetime) -> str:
    """What a reviewer reads before deciding: the whole call, args pretty-printed."""
    args = orjson.dumps(effect.args, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    rows = [
        ("tool", visible(effect.tool)),
        ("workflow", visible(effect.workflow_id)),
        ("call id", visible(effect.call_id) if effect.call_id is not None else "-"),
        ("key", effect.idem_key),
        ("created", effect.created_at.astimezone(UTC).isoformat(timespec="milliseconds")),
        ("waiting", _waited(now - effect.created_at)),
        ("repeats", f"{effect.dedup_count} more calls asked for it"),
    ]
    if effect.resource is not None:
        rows.append(("resource", visible(orjson.dumps(effect.resource).decode())))
    if effect.parked:
        started = effect.started_at
        rows += [
            ("reason", "ambiguous attempt: its worker went silent mid-handler, so nobody "
             "knows whether it happened; check downstream first"),
            ("attempt", str(effect.attempt)),
            ("started", started.astimezone(UTC).isoformat(timespec="milliseconds")
             if started is not None else "-"),
            ("worker", visible(effect.worker) if effect.worker else "-"),
        ]  # fmt: skip
    width = max(len(label) for label, _ in rows)
    lines = [f"  {label.rjust(width)}  {value}" for label, value in rows]
    lines.append(f"  {'args'.rjust(width)}")
    # JSON escapes C0 controls itself, but not DEL, C1 or bidirectional marks.
    lines += [f"    {visible(line)}" for line in args.splitlines()]
    return "\n".join(lines)


def _waited(span: timedelta) -> str:
    if span.total_seconds() < 120:
        return f"{max(span.total_seconds(), 0.0):.1f} s"
    seconds = int(span.total_seconds())
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} days {hours % 24} h"


async def _all_pending(ledger: EffectLedger) -> list[Effect]:
    """Every effect waiting for approval, oldest first."""
    found: list[Effect] = []
    cursor: str | None = None
    while True:
        page = await ledger.list_effects(
            status=EffectStatus.REQUIRES_APPROVAL, limit=1_000, cursor=cursor
        )
        found += page.effects
        cursor = page.next_cursor
        if cursor is None:
            break
    found.reverse()  # listed newest first
    return found


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
