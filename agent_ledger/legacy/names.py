"""agent-ledger 0.2.x's public names: where each went, or why it is gone.

``import agent_ledger`` resolves a missing name through :func:`resolve`
(``agent_ledger.__getattr__``): a 0.2.x name with the same meaning here
still works and warns (``DeprecationWarning``) with the new spelling; one
without an equivalent raises :class:`RemovedNameError` saying what to use instead.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TypeAlias

from agent_ledger.effects import CommitFailed, CommitSucceeded
from agent_ledger.status import TERMINAL, EffectStatus

#: 0.2.x's union of the two commit outcomes; the same two classes here.
CommitOutcome: TypeAlias = CommitSucceeded | CommitFailed


def is_terminal_status(status: EffectStatus | str) -> bool:
    """0.2.x's test: is ``status`` final (succeeded, failed, canceled, denied)?"""
    return EffectStatus(status) in TERMINAL


class RemovedNameError(ImportError):
    """A 0.2.x public name with no equivalent in this version.

    An ``ImportError`` and deliberately *not* an ``AttributeError``: for
    ``from agent_ledger import canonicalize`` CPython replaces an
    ``AttributeError`` raised by a module's ``__getattr__`` with its generic
    "cannot import name", which would hide the guidance. The price, paid on
    purpose for the names in :data:`GONE` only: ``hasattr(agent_ledger, name)``
    and ``getattr(agent_ledger, name, default)`` raise this error instead of
    answering False / the default, so code probing for a 0.2.x name learns
    it is gone rather than silently taking another path.
    """

    def __init__(self, name: str, advice: str) -> None:
        super().__init__(
            f"agent_ledger.{name} (agent-ledger 0.2.x) has no equivalent here: {advice}; "
            "see docs/migrating-from-0.2.md",
            name="agent_ledger",
        )


#: 0.2.x name -> (module, attribute, how to spell it now).
RENAMED: dict[str, tuple[str, str, str]] = {
    "compute_idem_key": (
        "agent_ledger.keys",
        "idempotency_key",
        "agent_ledger.keys.idempotency_key(call) (or ledger.idem_key(call)); it returns this "
        "version's key, and agent_ledger.legacy.keys.legacy_key_of(call) gives 0.2.x's",
    ),
    "EffectStore": ("agent_ledger.stores.base", "Store", "agent_ledger.Store"),
    "JsonValue": ("agent_ledger.effects", "JSONValue", "agent_ledger.JSONValue"),
    "TERMINAL_STATUSES": ("agent_ledger.status", "TERMINAL", "agent_ledger.status.TERMINAL"),
    "is_terminal_status": (
        "agent_ledger.legacy.names",
        "is_terminal_status",
        "status in agent_ledger.status.TERMINAL",
    ),
    "CommitOutcome": (
        "agent_ledger.legacy.names",
        "CommitOutcome",
        "agent_ledger.effects.CommitSucceeded | agent_ledger.effects.CommitFailed",
    ),
}

#: 0.2.x names with no equivalent here, and what to do instead.
GONE: dict[str, str] = {
    "canonicalize": (
        "0.2.x's canonicalize() wrote RFC 8785 JSON, which this version no longer uses for keys; "
        "use agent_ledger.keys.canonical_json(value, field=...) for this version's canonical "
        "JSON, or agent_ledger.legacy.keys.jcs(value) for 0.2.x's"
    ),
    "ALLOWED_TRANSITIONS": "use agent_ledger.status.TRANSITIONS (it includes takeover and reopen)",
    "AWAITING_STATUSES": "use agent_ledger.status.CLAIMABLE or the statuses you wait on",
    "is_awaiting_status": "compare with agent_ledger.EffectStatus members",
    "is_valid_transition": "use agent_ledger.status.TRANSITIONS[from_status]",
    "IdempotencyStatus": "BeginResult tells fresh from replayed; see docs/api.md",
    "UpsertEffectInput": "stores take NewEffect (agent_ledger.stores.base); see the Store protocol",
    "UpsertEffectResult": "stores return BeginOutcome (agent_ledger.stores.base)",
    "generate_id": "stores assign effect ids; use uuid.uuid4() for ids of your own",
    "resource_id_canonical": "Effect.resource_id_canonical holds it; see agent_ledger.keys",
    "validate_args": "agent_ledger.keys.canonicalize(call) validates args and computes the key",
    "get_logger": "agent-ledger logs through logging.getLogger('agent_ledger')",
    "get_tracer": "see agent_ledger.observability",
}


def resolve(name: str) -> object:
    """The current object for 0.2.x's ``name`` (warning), a :class:`RemovedNameError`
    for a name 0.2.x had and this version dropped, else the usual AttributeError."""
    if name in RENAMED:
        module, attribute, spelling = RENAMED[name]
        warnings.warn(
            f"agent_ledger.{name} is 0.2.x's name; use {spelling}",
            DeprecationWarning,
            stacklevel=3,
        )
        return getattr(importlib.import_module(module), attribute)
    if name in GONE:
        raise RemovedNameError(name, GONE[name])
    raise AttributeError(f"module 'agent_ledger' has no attribute {name!r}")
