"""Calls made with ``legacy_keys=True``: answered by the effect imported under their 0.2.x key.

Apart from acquiring.py so each engine module fits on a screen.
"""

from __future__ import annotations

import logging

from agent_ledger.engine.preparing import Prepared
from agent_ledger.errors import EffectPayloadMismatchError
from agent_ledger.legacy.keys import legacy_mismatched_args
from agent_ledger.observability import log_effect
from agent_ledger.stores.base import SchemaCheck, Store

__all__ = ["follow_legacy_key"]


async def follow_legacy_key(
    store: Store, schema: SchemaCheck, prepared: Prepared, tx: object | None
) -> Prepared:
    """``legacy_keys=True``: the call goes on under the key of the effect its
    0.2.x key was imported as, so it is answered (replayed, waited for,
    claimed) exactly as that effect's own calls are. Before ``acquire``,
    so that every later step of the run (waiting again after a lost
    commit included) uses that key.

    Not when nothing was imported under that key, or the effect found is
    another workflow's or tool's: 0.2.x's ``"|"`` join gave both the same
    key, and that receipt is not this call's.
    """
    new, legacy_key = prepared.new, prepared.legacy_key
    if legacy_key is None:
        return prepared
    if not schema.ok:
        await schema.ensure(tx)
    effect = await store.find_legacy(legacy_key, tx=tx)
    if (
        effect is None
        or effect.idem_key == new.idem_key
        or (effect.workflow_id, effect.tool) != (new.workflow_id, new.tool)
    ):
        return prepared
    if prepared.validate_keys is not None:
        # Compared as 0.2.x compared them: its records cannot tell 1 from 1.0.
        differ = legacy_mismatched_args(
            effect.args_canonical, new.args_canonical, prepared.validate_keys
        )
        if differ:
            log_effect(logging.INFO, f"payload mismatch on {list(differ)}", effect)
            raise EffectPayloadMismatchError(effect, differ)
    log_effect(logging.DEBUG, "answered by the effect imported under its 0.2.x key", effect)
    return prepared._replace(new=new._replace(idem_key=effect.idem_key), validate_keys=None)
