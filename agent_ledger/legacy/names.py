"""agent-ledger 0.2.x's public names: where each went, or why it is gone.

``import agent_ledger`` resolves a missing name through :func:`resolve`
(``agent_ledger.__getattr__``): a 0.2.x name with the same meaning here
still works and warns (``DeprecationWarning``) with the new spelling; one
without an equivalent raises :class:`RemovedNameError` saying what to use instead.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TypeAlias

from agent_ledger.effects import CommitFailed, CommitSucceeded
from agent_ledger.errors import RemovedNameError
from agent_ledger.status import TERMINAL, EffectStatus

#: 0.2.x's union of the two commit outcomes; the same two classes here.
CommitOutcome: TypeAlias = CommitSucceeded | CommitFailed


def is_terminal_status(status: EffectStatus | str) -> bool:
    """0.2.x's test: is ``status`` final (succeeded, failed, canceled, denied)?"""
    return EffectStatus(status) in TERMINAL


# Defined in agent_ledger.errors (the lowest layer, so that the errors' own 0.2.x
# constructors can raise it); this is its documented home. An ``ImportError``
# and deliberately *not* an ``AttributeError``: for ``from agent_ledger import
# canonicalize`` CPython replaces an ``AttributeError`` raised by a module's
# ``__getattr__`` with its generic "cannot import name", which would hide the
# guidance. The price, paid on purpose for the names in :data:`GONE` only:
# ``hasattr(agent_ledger, name)`` and ``getattr(agent_ledger, name, default)``
# raise this error instead of answering False / the default, so code probing
# for a 0.2.x name learns it is gone rather than silently taking another path.
__all__ = [
    "GONE",
    "MODULE_NAMES",
    "RENAMED",
    "STORE_METHODS",
    "CommitOutcome",
    "RemovedNameError",
    "is_terminal_status",
    "resolve",
    "resolve_in",
]


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
    "IdempotencyStatus": (
        "BeginResult.idempotency_status is the plain string 'fresh' or 'replayed'; "
        "annotate it as str (see BeginResult in docs/guide.md)"
    ),
    "UpsertEffectInput": "stores take NewEffect (agent_ledger.stores.base); see the Store protocol",
    "UpsertEffectResult": "stores return BeginOutcome (agent_ledger.stores.base)",
    "generate_id": "stores assign effect ids; use uuid.uuid4() for ids of your own",
    "resource_id_canonical": "Effect.resource_id_canonical holds it; see agent_ledger.keys",
    "validate_args": "agent_ledger.keys.canonicalize(call) validates args and computes the key",
    "get_logger": "agent-ledger logs through logging.getLogger('agent_ledger')",
    "get_tracer": "see agent_ledger.observability",
}


#: 0.2.x's names in its modules ``agent_ledger.types`` and ``agent_ledger.utils``
#: that keep their meaning here, under the top-level name: name -> (module, attribute).
SAME: dict[str, tuple[str, str]] = {
    "EffectStatus": ("agent_ledger.status", "EffectStatus"),
    "ResourceDescriptor": ("agent_ledger.calls", "ResourceDescriptor"),
    "ToolCall": ("agent_ledger.calls", "ToolCall"),
    "EffectError": ("agent_ledger.effects", "EffectError"),
    "Effect": ("agent_ledger.effects", "Effect"),
    "CommitSucceeded": ("agent_ledger.effects", "CommitSucceeded"),
    "CommitFailed": ("agent_ledger.effects", "CommitFailed"),
    "BeginResult": ("agent_ledger.effects", "BeginResult"),
    "ConcurrencyOptions": ("agent_ledger.options", "ConcurrencyOptions"),
    "StaleOptions": ("agent_ledger.options", "StaleOptions"),
    "RunOptions": ("agent_ledger.options", "RunOptions"),
    "LedgerDefaults": ("agent_ledger.options", "LedgerDefaults"),
    "LedgerHooks": ("agent_ledger.options", "LedgerHooks"),
    "DEFAULT_MAX_ARGS_SIZE_BYTES": ("agent_ledger.keys", "DEFAULT_MAX_ARGS_SIZE_BYTES"),
}

_PYDANTIC = (
    "0.2.x's pydantic field constraint; options here are dataclasses that check their "
    "fields when built (EffectLedgerValidationError naming the field)"
)
#: 0.2.x names with no equivalent that only its submodules had.
MODULE_GONE: dict[str, str] = {
    "NonEmptyStr": _PYDANTIC,
    "PositiveInt": _PYDANTIC,
    "NonNegativeInt": _PYDANTIC,
    "PositiveFloat": _PYDANTIC,
    "UnitFloat": _PYDANTIC,
    "TxT": "stores take tx: object | None (the handle store.transaction() yields)",
}

#: Every public name of 0.2.x's modules, as 0.2.1 spelled them (its ``__all__``s and
#: module-level names); each resolves through :func:`resolve_in`, and
#: docs/migrating-from-0.2.md lists each one.
MODULE_NAMES: dict[str, tuple[str, ...]] = {
    "agent_ledger": (
        "ALLOWED_TRANSITIONS", "AWAITING_STATUSES", "TERMINAL_STATUSES", "BeginResult",
        "CommitFailed", "CommitOutcome", "CommitSucceeded", "ConcurrencyOptions", "Effect",
        "EffectDeniedError", "EffectError", "EffectFailedError", "EffectLedger",
        "EffectLedgerError", "EffectLedgerInvariantError", "EffectLedgerOptions",
        "EffectLedgerValidationError", "EffectStatus", "EffectStore", "EffectStoreError",
        "EffectTimeoutError", "IdempotencyStatus", "JsonValue", "LedgerDefaults",
        "LedgerHooks", "MemoryStore", "ResourceDescriptor", "RunOptions", "StaleOptions",
        "ToolCall", "UpsertEffectInput", "UpsertEffectResult", "canonicalize",
        "compute_idem_key", "generate_id", "get_logger", "get_tracer", "is_awaiting_status",
        "is_terminal_status", "is_valid_transition", "resource_id_canonical",
        "validate_args", "__version__",
    ),
    "agent_ledger.types": (
        "EffectStatus", "TERMINAL_STATUSES", "AWAITING_STATUSES", "ALLOWED_TRANSITIONS",
        "is_terminal_status", "is_awaiting_status", "is_valid_transition",
        "IdempotencyStatus", "ResourceDescriptor", "ToolCall", "EffectError", "Effect",
        "CommitSucceeded", "CommitFailed", "CommitOutcome", "BeginResult",
        "UpsertEffectInput", "UpsertEffectResult", "ConcurrencyOptions", "StaleOptions",
        "RunOptions", "LedgerDefaults", "LedgerHooks", "JsonValue", "NonEmptyStr",
        "PositiveInt", "NonNegativeInt", "PositiveFloat", "UnitFloat",
    ),
    "agent_ledger.utils": (
        "canonicalize", "validate_args", "resource_id_canonical", "compute_idem_key",
        "generate_id", "DEFAULT_MAX_ARGS_SIZE_BYTES",
    ),
    "agent_ledger.stores": ("EffectStore", "MemoryStore", "TxT"),
}  # fmt: skip

#: 0.2.x's store methods (its ``EffectStore`` protocol and ``MemoryStore``) that
#: this version's stores answer with a deprecation warning, or a
#: :class:`RemovedNameError` naming what to use: method -> advice.
STORE_METHODS: dict[str, str] = {
    "find_by_idem_key": "works, warning: use store.find(idem_key) or ledger.find_by_idem_key(key)",
    "find_by_id": "works, warning: use store.get(effect_id) or ledger.get_effect(effect_id)",
    "list_effects": (
        "with no query, works, warning: every effect, oldest first, as 0.2.x's MemoryStore; "
        "use ledger.list_effects(...) (filters, pages)"
    ),
    "size": "MemoryStore only, works, warning: use len(store) or (await ledger.stats())",
    "upsert": (
        "ledger.begin(call) inserts or finds the effect (Store.begin(NewEffect) for store authors)"
    ),
    "claim_for_processing": (
        "ledger.begin(call) or run() claim a ready or stale effect (Store.claim(idem_key, "
        "stale_after_ms=...) for store authors)"
    ),
    "increment_dedup_count": "begin() counts duplicates itself",
    "transition": (
        "0.2.x's transition(effect_id, from_status, to_status, result=..., error=...) is now "
        "the ledger's steps: commit(effect_id, CommitSucceeded(...) | CommitFailed(...)) "
        "records an outcome, approve()/deny()/cancel() decide; Store.transition(idem_key, "
        "target=...) is a store author's compare-and-set from the statuses the state "
        "machine allows"
    ),
    "clear": "open a new MemoryStore() (or purge() finished effects)",
}


def resolve(name: str) -> object:
    """The current object for 0.2.x's ``name`` (warning), a :class:`RemovedNameError`
    for a name 0.2.x had and this version dropped, else the usual AttributeError."""
    return resolve_in("agent_ledger", name, stacklevel=4)


def resolve_in(module: str, name: str, *, stacklevel: int = 3) -> object:
    """:func:`resolve` for 0.2.x's module ``module`` (``agent_ledger``, or one of the
    shims ``agent_ledger.types`` and ``agent_ledger.utils``). A submodule answers
    only for the names 0.2.x's module of that name had."""
    if module != "agent_ledger" and name not in MODULE_NAMES.get(module, ()):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    if name in RENAMED:
        where, attribute, spelling = RENAMED[name]
        warnings.warn(
            f"{module}.{name} is 0.2.x's name; use {spelling}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return getattr(importlib.import_module(where), attribute)
    if name in GONE:
        raise RemovedNameError(name, GONE[name], owner=module)
    if module != "agent_ledger":
        if name in SAME:
            where, attribute = SAME[name]
            # The top-level name if the package exports it, else its module
            # (a name moved off the top level warns there too).
            exported = attribute in getattr(sys.modules.get("agent_ledger"), "__all__", ())
            spelling = (
                f"agent_ledger.{attribute}"
                if exported and where != "agent_ledger.keys"
                else f"{where}.{attribute}"
            )
            warnings.warn(
                f"{module} is 0.2.x's module; import {name} as {spelling}",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            return getattr(importlib.import_module(where), attribute)
        raise RemovedNameError(name, MODULE_GONE[name], owner=module)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
