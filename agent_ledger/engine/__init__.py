"""The run engine: everything between a call arriving and its outcome returning.

``EffectLedger.run()`` and ``begin()`` are thin calls into :class:`Engine`,
which depends on the ``Store`` Protocol alone:

* :mod:`~agent_ledger.engine.lifecycle` acquires an effect (insert or find
  it), executes the handler of an effect it owns, and records the outcome
  (fenced by the attempt, retried after store errors);
* :mod:`~agent_ledger.engine.waiting` waits while someone else holds the
  effect or a person has to decide, and claims it when it may;
* :mod:`~agent_ledger.engine.ownership` carries a begin or claim to its end
  when the run is cancelled, and gives back an effect it made the run's;
* :mod:`~agent_ledger.engine.parking` records a handler's start under
  ``on_stale="park"``, so that a silent holder is parked for a person
  instead of taken over;
* :mod:`~agent_ledger.engine.heartbeats` keeps running handlers alive;
* :mod:`~agent_ledger.engine.polling` lets waiters on one key share a read.

Policy lives here; atomicity lives in the store.
"""

from __future__ import annotations

from agent_ledger.engine.lifecycle import Acquired, Engine, Prepared

__all__ = ["Acquired", "Engine", "Prepared"]
