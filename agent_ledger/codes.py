"""Every error code the ledger itself records, in one table.

An effect's ``error.code`` (and a saga's) is machine-readable: code that
decides what to do after a failure matches on it, and it is stored, so a
code's spelling is part of the data format. The codes the ledger writes are
the members of ``ErrorCode``; everything else in ``error.code`` came from a
handler (its exception's ``code`` attribute, or its class name). Each member
says when it is recorded (``ErrorCode.X.when``), and docs/concepts.md lists
them all.

``ErrorCode`` is a ``StrEnum``: a member *is* its string, so
``effect.error.code == ErrorCode.HANDLER_TIMEOUT`` works on an effect read
back from any store, and values stored before this table existed mean what
they meant.

Two members differ only in spelling, and that is on purpose: they record two
different causes, both already in stored data. ``RUN_CANCELLED``
(``"cancelled"``) is the engine's: the task running a call was cancelled while
its handler ran, so nobody knows whether the side effect happened.
``CANCELED`` (``"canceled"``, like the status) is a decision: a person's
``cancel()``, or a saga rolling back a step that waited for one. The adapters
tell a model different things for each, so they are not merged.
"""

from __future__ import annotations

import enum
from typing import Self

__all__ = ["DecisionCode", "ErrorCode"]


class _Described(enum.StrEnum):
    """A string code that says when it is recorded (``.when``); no members of its own."""

    when: str

    # ``when`` has a default only so that a look-up, ``ErrorCode("denied")``,
    # type-checks: the enum machinery routes that call elsewhere, and every
    # member gives its text (a test checks none is empty).
    def __new__(cls, value: str, when: str = "") -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.when = when
        return member


class ErrorCode(_Described):
    """The error codes agent-ledger records, each with when it is recorded (``.when``)."""

    # -- a person's decision ------------------------------------------------
    DENIED = "denied", "a person denied the effect (`deny()`); the message is their reason"
    CANCELED = (
        "canceled",
        "a person canceled the effect (`cancel()`), or a saga rolled back a step that "
        "waited for one or whose worker stopped; also a saga whose own task was cancelled",
    )
    APPROVAL_EXPIRED = (
        "expired",
        "nobody decided before the approval's deadline (`agent_ledger.approvals`): a sweep, "
        "or the console on reading it, denied the effect; silence is never consent",
    )
    AMBIGUOUS_ATTEMPT = (
        "ambiguous_attempt",
        'a worker went silent after its handler started (`on_stale="park"`): the effect '
        "waits in `requires_approval` for a person to say whether it took effect",
    )

    # -- the engine, about the handler's run ----------------------------------
    RUN_CANCELLED = (
        "cancelled",
        "the task running the call was cancelled while its handler ran or waited to retry; "
        "the effect is `canceled` and its side effect may have happened",
    )
    HANDLER_TIMEOUT = (
        "handler_timeout",
        "the handler ran past its deadline (`RunOptions(timeout_ms=...)`)",
    )
    RETRIES_EXHAUSTED = (
        "retries_exhausted",
        "every try the retry policy allowed failed; the history keeps each try's error",
    )
    TOO_MANY_TAKEOVERS = (
        "too_many_takeovers",
        "the effect was taken over more than `max_takeovers` times; not run again",
    )
    RESULT_NOT_SERIALIZABLE = (
        "result_not_serializable",
        "the handler returned a value that is not JSON",
    )
    RESULT_TOO_LARGE = (
        "result_too_large",
        "the handler's result (with its usage) is bigger than the store can hold "
        "(MariaDB/MySQL: `max_allowed_packet`); the side effect happened",
    )
    OUTCOME_NOT_STORED = (
        "outcome_not_stored",
        "the store refused the handler's outcome as it was (data too long); the side "
        "effect happened, and the message says what the store said",
    )
    USAGE_NOT_SERIALIZABLE = (
        "usage_not_serializable",
        "the handler's returned `usage` could not be recorded",
    )

    # -- sagas ------------------------------------------------------------------
    SAGA_ROLLED_BACK = (
        "saga_rolled_back",
        "a saga was rolled back before this step of it began; the step never ran",
    )
    SAGA_ABANDONED = (
        "abandoned",
        "a saga's owner was gone longer than `abandon_after`; recovery rolled it back",
    )
    STEP_CANCELED = (
        "step_canceled",
        "the task of a step started with `saga.start()` was cancelled; the saga rolled back",
    )


class DecisionCode(_Described):
    """Why a person's decision attempt was accepted or refused: the ``reason_code``
    of each row of the decision audit trail (``agent_ledger_decision_attempts``),
    each with when it is recorded (``.when``). Stored: a member's spelling is part
    of the data format."""

    DECIDED = "decided", "the decision was accepted: this attempt made the transition"
    ALREADY_DECIDED = (
        "already_decided",
        "someone decided first (or the effect no longer waits for a person): nothing changed",
    )
    UNKNOWN_EFFECT = "unknown_effect", "no effect has this key: nothing changed"
    INTENT_MISMATCH = (
        "intent_mismatch",
        "the intent hash the person was shown differs from what would run (other args, "
        "workflow, tool or policy version): nothing runs",
    )
    NOT_PARKED = (
        "not_parked",
        "resolve was asked for an effect that waits for an approval, not for an ambiguous "
        "attempt's outcome",
    )
    NOT_ALLOWED = (
        "not_allowed",
        "the authenticated principal may not decide this tool (the authorization rule)",
    )
    SELF_DECISION = (
        "self_decision",
        "the principal who asked for the approval tried to decide it, and separation of duty is "
        "on (in `decide()`, or, with PostgreSQL's role set, refused by the database: 42501)",
    )
    EXPIRED = "expired", "the approval's deadline had passed: the effect was denied as expired"
    UNKNOWN_REQUESTER = (
        "unknown_requester",
        "PostgreSQL's role set with separation of duty refused a decision on an effect "
        "whose request records nobody as its asker (a parked attempt excepted)",
    )
    NOT_AN_APPROVER = (
        "not_an_approver",
        "PostgreSQL with the role set installed refused the decision: the session's role is "
        "not a member of the approver role (SQLSTATE 42501); nothing changed",
    )
    LINK_INVALID = (
        "link_invalid",
        "a signed link that does not verify (forged, tampered, or for another effect)",
    )
    LINK_EXPIRED = "link_expired", "a signed link past its expiry"
    LINK_USED = "link_used", "a single-use link that had already decided"
    UNMAPPED_USER = (
        "unmapped_user",
        "a Slack user (vouched for by Slack's request signature) whom the Slack settings' "
        "user mapping names no principal; the attempt's principal is slack:<team>:<user>",
    )
    NOTE_TOO_LONG = (
        "note_too_long",
        "the decision's note was longer than agent_ledger.deciding.MAX_NOTE_CHARS: nothing "
        "changed, and the note is not kept",
    )
    EARLIER_ATTEMPT = (
        "earlier_attempt",
        "the person decided what they were shown for an earlier attempt (approval round) of "
        "the effect, which has since run and waits again: nothing changed",
    )
