"""Deterministic replay: re-run a recorded workflow with every call answered from its receipt.

``ledger.replay(workflow_id, source=...)`` (see ``docs/replay.md``) opens a
block in which the ledger's calls are matched to the recorded run by
idempotency key and answered from it, so a failed run can be debugged
step by step without touching the outside world again. This layer sits
beside sagas, above tools: the ledger offers it one door, the recording it
reads from the context (``agent_ledger.context.recording``) where a call
would begin; the engine never knows.
"""

from __future__ import annotations

from agent_ledger.replay._replay import Replay
from agent_ledger.replay._sources import read_export

__all__ = ["Replay", "read_export"]
