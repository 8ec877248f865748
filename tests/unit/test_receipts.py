"""The human receipt says what happened without inviting a misreading."""

from __future__ import annotations

import dataclasses
import io
import re
from datetime import UTC, datetime, timedelta

import pytest

from agent_ledger import Effect, EffectError, EffectStatus
from agent_ledger.cli import Output, effects_table
from agent_ledger.effects import Reopening, TryFailure
from agent_ledger.receipt import render_receipt

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BASE = Effect(
    id="00000000-0000-4000-8000-000000000000", idem_key="ab" * 32, workflow_id="w",
    call_id=None, tool="t", status=EffectStatus.PROCESSING, args_canonical="{}",
    resource_id_canonical=None, result=None, error=None, dedup_count=0, attempt=1,
    created_at=T0, updated_at=T0, completed_at=None, heartbeat_at=T0, started_at=T0,
    executions=1, lease_ms=15_000,
)  # fmt: skip


def rows(effect: Effect) -> dict[str, str]:
    """The receipt's rows by label (labels are right-aligned, two spaces before the value)."""
    lines = render_receipt(effect).splitlines()
    return {label: value.strip() for label, value in (ln.strip().split("  ", 1) for ln in lines)}


@pytest.mark.parametrize(
    "status", [EffectStatus.PROCESSING, EffectStatus.REQUIRES_APPROVAL, EffectStatus.READY]
)
def test_an_effect_without_an_outcome_says_pending(status: EffectStatus) -> None:
    assert rows(dataclasses.replace(BASE, status=status))["outcome"] == "pending"


def test_a_handler_that_returned_none_shows_null() -> None:
    done = dataclasses.replace(BASE, status=EffectStatus.SUCCEEDED, completed_at=T0)
    assert rows(done)["outcome"] == "null"
    failed = dataclasses.replace(
        BASE, status=EffectStatus.FAILED, completed_at=T0, error=EffectError("boom", "E")
    )
    assert rows(failed)["outcome"] == "error: [E] boom"


def test_an_approved_run_shows_one_execution_and_its_wait_apart() -> None:
    """attempt 2 (the approval's claim) is the fencing token, not a second run;
    the handler time leaves out the 3 s spent waiting for a person."""
    decided = T0 + timedelta(seconds=3)
    effect = dataclasses.replace(
        BASE,
        status=EffectStatus.SUCCEEDED,
        attempt=2,
        executions=1,
        decided_at=decided,
        decided_by="ada",
        started_at=decided,
        completed_at=decided + timedelta(milliseconds=12.5),
    )
    shown = rows(effect)
    assert shown["executions"] == "1"
    assert shown["fencing token"] == "attempt 2"
    assert shown["approval wait"] == "3.0 s"
    assert shown["handler time"] == "12.5 ms"
    assert "run time" not in shown
    assert shown["decision"] == "approved by ada"
    assert "attempts" not in shown and "duration" not in shown


def test_a_denied_effect_has_no_run_and_no_approval_wait() -> None:
    effect = dataclasses.replace(
        BASE,
        status=EffectStatus.DENIED,
        executions=0,
        started_at=None,
        decided_at=T0 + timedelta(minutes=5),
        completed_at=T0 + timedelta(minutes=5),
        error=EffectError("no", "denied"),
    )
    shown = rows(effect)
    assert shown["executions"] == "0"
    assert shown["started"] == "-"
    assert "handler time" not in shown and "approval wait" not in shown


def test_a_run_settled_by_a_person_has_no_handler_time_from_the_wait() -> None:
    """A parked run resolved 23 s after it started: its handler's end is unknown,
    and the 23 s (a dead worker's silence and a person's wait) is not shown as it."""
    started = T0 + timedelta(milliseconds=5)
    effect = dataclasses.replace(
        BASE,
        status=EffectStatus.SUCCEEDED,
        executions=1,
        started_at=started,
        decided_at=started + timedelta(seconds=23.9),
        decided_by="ada",
        completed_at=started + timedelta(seconds=23.9),
    )
    shown = rows(effect)
    assert shown["handler time"] == "unknown: a person decided after the run started"
    assert "run time" not in shown


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(milliseconds=0.4), "0.4 ms"),
        (timedelta(seconds=59.94), "59.9 s"),
        (timedelta(minutes=7, seconds=3), "7 min 3 s"),
        (timedelta(hours=26, minutes=5), "26 h 5 min"),
    ],
)
def test_long_spans_read_in_their_own_units(span: timedelta, text: str) -> None:
    effect = dataclasses.replace(BASE, status=EffectStatus.SUCCEEDED, completed_at=T0 + span)
    assert rows(effect)["handler time"] == text


def test_a_retried_effect_shows_its_tries_and_every_failed_try() -> None:
    later = T0 + timedelta(seconds=1)
    effect = dataclasses.replace(
        BASE,
        status=EffectStatus.FAILED,
        completed_at=later,
        tries=2,
        error=EffectError("gave up after 2 tries (attempts=2); last error: [E] down", "x"),
        history=(
            TryFailure(1, 1, "reset", "ConnectionError", "ConnectionError", T0),
            TryFailure(2, 2, "down", "E", "app.errors.Down", later),
        ),
    )
    shown = rows(effect)
    assert shown["tries"] == "2"
    assert shown["try 1"] == f"{T0.isoformat(timespec='milliseconds')} failed: " + (
        "[ConnectionError] reset (ConnectionError)"
    )
    assert shown["try 2"].endswith("failed: [E] down (app.errors.Down)")


def test_a_reopened_effect_shows_who_reopened_it_why_and_how_it_had_ended() -> None:
    when = T0 + timedelta(minutes=1)
    effect = dataclasses.replace(
        BASE,
        status=EffectStatus.READY,
        decided_at=when,
        decided_by="ops",
        decision_note="typo fixed",
        history=(
            Reopening(EffectStatus.FAILED, EffectError("name 'x'", "NameError"), 1, "ops",
                      "typo fixed", when),
        ),
    )  # fmt: skip
    shown = rows(effect)
    assert shown["decision"] == "reopened by ops: typo fixed"
    assert "approval wait" not in shown
    assert shown["reopened"].endswith(
        "by ops: typo fixed; was failed ([NameError] name 'x'), after 1 try"
    )
    assert shown["tries"] == "0"


def test_a_run_in_one_try_does_not_say_so() -> None:
    done = dataclasses.replace(BASE, status=EffectStatus.SUCCEEDED, completed_at=T0, tries=1)
    assert "tries" not in rows(done)


def test_show_and_list_escape_what_agents_and_people_wrote() -> None:
    """`show` (the receipt) and `list` (the table) print no ESC, C1, DEL or bidi mark."""
    nasty = dataclasses.replace(
        BASE,
        tool="t\x1b[2J\u009b31m",
        workflow_id="w\u202e",
        call_id="c\x85",
        args_canonical='{"a":"\u009b2J\x7f"}',
        status=EffectStatus.DENIED,
        decided_at=T0,
        decided_by="b\x1b]0;x\x07",
        decision_note="line one\nline two",
        error=EffectError("no\x1b[31m", "denied"),
    )
    unsafe = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    shown = render_receipt(nasty)
    assert unsafe.findall(shown) == []
    assert rows(nasty)["tool"] == "t\\x1b[2J\\x9b31m"
    assert rows(nasty)["decision"] == "denied by b\\x1b]0;x\\x07: line one\\x0aline two"
    table = io.StringIO()
    effects_table(Output(table, colour=False), [nasty])
    assert unsafe.findall(table.getvalue()) == []
    assert "t\\x1b[2J\\x9b31m" in table.getvalue() and "w\\u202e" in table.getvalue()
