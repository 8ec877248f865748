"""Where a replay's recording comes from: an export file, or a store it only reads.

Either way the recording is the workflow's effects by idempotency key, read
once: a file when the replay is made (so a bad file fails there, before any
code runs), a store when the block is entered (``async with``) or at its
first call (``with``, which cannot wait for a store). Nothing here writes:
a file is opened for reading, and a store is asked only ``list_effects``
(and, for a ``legacy_keys=True`` ledger's call with no recording under its
own key, ``find_legacy``), which change no row and count no duplicate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Final

import orjson

from agent_ledger.effects import Effect
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.receipt import effect_from_record
from agent_ledger.stores.base import EffectQuery, Store

__all__ = ["read_export", "read_store"]

#: Effects read from a store per page.
_PAGE: Final = 1_000
#: How many other workflows an error about a wrong file names.
_NAMED: Final = 5


def _bad(message: str) -> EffectLedgerValidationError:
    return EffectLedgerValidationError(message, field="source")


def read_export(path: str | os.PathLike[str], workflow_id: str) -> dict[str, Effect]:
    """``workflow_id``'s effects in an ``agent-ledger export --format jsonl`` file, by key.

    Lines of other workflows are skipped (an export without ``--workflow``
    works too); a file with none of this workflow's, a line that is not an
    exported effect, or a key found twice raises ``EffectLedgerValidationError``
    naming the file and line.
    """
    name = os.fsdecode(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise _bad(
            f"replay source {name!r}: no such file. Give the path of a file written by "
            f"`agent-ledger export --workflow {workflow_id} --format jsonl -o FILE`, or a store."
        ) from None
    except OSError as exc:
        raise _bad(f"replay source {name!r} cannot be read: {exc.strerror or exc}") from None
    effects: dict[str, Effect] = {}
    others: dict[str, None] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        effect = _effect_on(line, f"replay source {name!r}, line {number}")
        if effect.workflow_id != workflow_id:
            others[effect.workflow_id] = None
            continue
        if effect.idem_key in effects:
            raise _bad(
                f"replay source {name!r}, line {number}: effect {effect.idem_key[:12]}… "
                "appears a second time; an export lists each effect once. Export the "
                "workflow again."
            )
        effects[effect.idem_key] = effect
    if not effects:
        if others:
            found = ", ".join(repr(w) for w in list(others)[:_NAMED])
            more = f" and {len(others) - _NAMED} more" if len(others) > _NAMED else ""
            raise _bad(
                f"replay source {name!r} holds no effects of workflow {workflow_id!r}, "
                f"only of {found}{more}: was it exported with --workflow {workflow_id}?"
            )
        raise _bad(
            f"replay source {name!r} holds no effects: export the run with "
            f"`agent-ledger export --workflow {workflow_id} --format jsonl`."
        )
    return effects


def _effect_on(line: bytes, where: str) -> Effect:
    """The effect one exported line holds, or an error saying what is wrong with it."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        hint = " (a JSON array: export with --format jsonl)" if line.strip() == b"[" else ""
        raise _bad(f"{where} is not JSON{hint}: {exc}") from None
    if not isinstance(record, dict):
        raise _bad(
            f"{where} is a JSON {type(record).__name__}, not an exported effect (an object); "
            "the file must come from `agent-ledger export --format jsonl`"
        )
    try:
        return effect_from_record(record)
    except KeyError as exc:
        raise _bad(f"{where} is not an exported effect: it has no {exc.args[0]!r}") from None
    except EffectLedgerValidationError as exc:
        raise _bad(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise _bad(f"{where} is not an exported effect: {exc}") from None


async def read_store(store: Store, workflow_id: str) -> Mapping[str, Effect]:
    """``workflow_id``'s effects in ``store``, by key, read page by page with ``list_effects``."""
    effects: dict[str, Effect] = {}
    before: tuple[datetime, str] | None = None
    while True:
        page = await store.list_effects(
            EffectQuery(workflow_id=workflow_id, limit=_PAGE, before=before)
        )
        for effect in page:
            effects[effect.idem_key] = effect
        if len(page) < _PAGE:
            break
        last = page[-1]
        before = (last.created_at, last.id)
    if not effects:
        raise _bad(
            f"replay source {type(store).__name__} holds no effects of workflow "
            f"{workflow_id!r}: check the workflow id, and that this is the store the run used"
        )
    return effects
