"""Approvals for people, as values: what a decision is bound to, and what the
audit trail keeps of every attempt to make one.

A person approving a payment approves *what they were shown*. The intent hash
(:func:`intent_hash`) is the SHA-256 of the canonical (tool, workflow, args,
policy version, attempt) of the effect as it will run: the attempt names the
approval round, so an approval given for one round (say, before the handler
ran and its worker died) never approves the next; the console, a signed link or
Slack carries the hash the person saw, and a decision whose hash differs from
the stored effect's changes nothing. Every attempt, accepted or refused, is a
:class:`DecisionAttempt` in the store (schema version 4).

A value module: no I/O, nothing above it imported.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import orjson

from agent_ledger.codes import DecisionCode

__all__ = [
    "INTENT_HASH_LENGTH",
    "ApprovalRequest",
    "Channel",
    "DecisionAction",
    "DecisionAttempt",
    "DecisionOutcome",
    "NewDecisionAttempt",
    "UsedLink",
    "intent_hash",
    "is_intent_hash",
]

#: Hex digits of an intent hash (SHA-256).
INTENT_HASH_LENGTH: Final = 64


class Channel(enum.StrEnum):
    """Where a decision attempt came from (stored; the schema's CHECK mirrors it)."""

    CONSOLE = "console"
    LINK = "link"
    SLACK = "slack"
    CLI = "cli"
    CODE = "code"


class DecisionAction(enum.StrEnum):
    """What the person asked for (stored; the schema's CHECK mirrors it)."""

    APPROVE = "approve"
    DENY = "deny"
    RESOLVE = "resolve"


class DecisionOutcome(enum.StrEnum):
    """Whether the attempt made the transition (stored; the schema's CHECK mirrors it)."""

    ACCEPTED = "accepted"
    REFUSED = "refused"


def intent_hash(
    *,
    tool: str,
    workflow_id: str,
    args_canonical: str,
    policy_version: str | None,
    attempt: int,
) -> str:
    """The SHA-256 (lowercase hex) of what a decision is about.

    ``args_canonical`` is the effect's canonical JSON text, byte for byte as
    it is stored and as the handler will get it; ``attempt`` is the effect's
    attempt counter while it waits (every claim raises it, so each approval
    round has its own). The five parts are encoded as one JSON array, so no
    choice of values can make two different intents hash alike by moving a
    separator.
    """
    payload = orjson.dumps([tool, workflow_id, args_canonical, policy_version, attempt])
    return hashlib.sha256(payload).hexdigest()


def is_intent_hash(value: object) -> bool:
    """True for 64 lowercase hex digits (what :func:`intent_hash` returns)."""
    return (
        isinstance(value, str)
        and len(value) == INTENT_HASH_LENGTH
        and all(c in "0123456789abcdef" for c in value)
    )


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What the store keeps about an effect that was asked of a person."""

    idem_key: str
    #: Who asked (the worker's principal); None when not said.
    requested_by: str | None
    #: The approval policy's version; part of the intent hash.
    policy_version: str | None
    #: Past this (store clock) nobody may approve it: it is denied as expired.
    deadline_at: datetime | None
    #: When the escalation hook fired; None: not yet.
    escalated_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewDecisionAttempt:
    """One attempt to decide, before the store stamps its id and time."""

    idem_key: str
    #: The authenticated principal (never a name from the request body).
    principal: str
    channel: Channel
    action: DecisionAction
    #: The intent hash the person was shown; None when the channel sent none.
    intent_hash: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionAttempt:
    """One row of the decision audit trail."""

    id: int
    idem_key: str
    principal: str
    channel: Channel
    action: DecisionAction
    outcome: DecisionOutcome
    reason_code: DecisionCode
    intent_hash: str | None
    note: str | None
    at: datetime

    def to_json(self) -> dict[str, object]:
        """The attempt as plain JSON values (for exports)."""
        return {
            "id": self.id,
            "idem_key": self.idem_key,
            "principal": self.principal,
            "channel": self.channel.value,
            "action": self.action.value,
            "outcome": self.outcome.value,
            "reason_code": self.reason_code.value,
            "intent_hash": self.intent_hash,
            "note": self.note,
            "at": self.at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class UsedLink:
    """A signed link's nonce, consumed with the decision it made."""

    nonce: str
    action: DecisionAction
    expires_at: datetime
