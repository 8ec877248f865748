"""The run engine: everything between a call arriving and its outcome returning.

``EffectLedger.run()`` and ``begin()`` are thin calls into :class:`Engine`,
which depends on the ``Store`` Protocol alone:

* :mod:`~agent_ledger.engine.lifecycle` composes a call's steps
  (:class:`Engine`): :mod:`~agent_ledger.engine.preparing` checks it before
  anything is stored, :mod:`~agent_ledger.engine.acquiring` inserts or finds
  the effect, :mod:`~agent_ledger.engine.handlers` calls the handler (the one
  ``call_handler``), :mod:`~agent_ledger.engine.retrying` runs what happens
  between a retry policy's tries, and :mod:`~agent_ledger.engine.recording`
  records the outcome (fenced by the attempt, retried after store errors,
  carried through a cancellation);
* :mod:`~agent_ledger.engine.waiting` waits while someone else holds the
  effect or a person has to decide, and claims it when it may;
* :mod:`~agent_ledger.engine.cancellation` carries work to its end through
  a cancellation (``carry_through``), for the engine and the layers above;
* :mod:`~agent_ledger.engine.ownership` carries a begin or claim to its end
  when the run is cancelled, and gives back an effect it made the run's;
* :mod:`~agent_ledger.engine.parking` records a handler's start under
  ``on_stale="park"``, so that a silent holder is parked for a person
  instead of taken over;
* :mod:`~agent_ledger.engine.heartbeats` keeps running handlers (and a
  saga's owner) alive;
* :mod:`~agent_ledger.engine.polling` lets waiters on one key share a read.

Policy lives here; atomicity lives in the store.
"""

from __future__ import annotations

from agent_ledger.engine.lifecycle import Acquired, Engine, Prepared

__all__ = ["Acquired", "Engine", "Prepared"]
