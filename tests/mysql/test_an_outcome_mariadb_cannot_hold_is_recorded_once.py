"""An outcome bigger than MariaDB holds is recorded once, as a failure that
says so (issue 26 follow-up, finding 2; the adversary's a6b script).

A 20 MB result is over the server's ``max_allowed_packet`` (16 MB by
default): the commit failed, the engine retried it until the lease ran out,
and the next caller ran the handler again. Now the store's limit, read at
connect, is checked before the commit: the effect is recorded ``failed`` with
code ``result_too_large``, the first caller gets ``EffectLedgerValidationError``
and every later one the recorded failure. A value the server still refuses as
too long (a store error that says so) is recorded as ``outcome_not_stored``
rather than retried.
"""

from __future__ import annotations

import pytest

from agent_ledger import (
    EffectFailedError,
    EffectLedgerValidationError,
    EffectStatus,
    ToolCall,
)
from tests.harness import MySQLHarness

pytestmark = pytest.mark.mysql
CALL = ToolCall(workflow_id="wf", tool="report.build")


async def test_the_store_knows_the_biggest_result_it_holds(my: MySQLHarness) -> None:
    store = my.store
    assert 0 < store.max_result_bytes < store.server.max_allowed_packet


@pytest.mark.parametrize("size", ["over-packet", "under-packet-but-refused"])
async def test_a_result_too_large_for_the_server_is_recorded_once(
    my: MySQLHarness, size: str
) -> None:
    store = my.store
    if size == "under-packet-but-refused":
        # The check passes, the server refuses the packet: the store error
        # that says "too long" must not leave the effect to be run again.
        store.max_result_bytes = 10**10
    ledger = my.ledger()
    runs: list[int] = []
    big = "r" * (store.server.max_allowed_packet + 1_000_000)

    def build(effect: object) -> str:
        runs.append(1)
        return big

    with pytest.raises(EffectLedgerValidationError) as first:
        await ledger.run(CALL, build)
    with pytest.raises(EffectFailedError):
        await ledger.run(CALL, build)
    assert runs == [1]
    stored = await ledger.find_by_idem_key(ledger.idem_key(CALL))
    assert stored is not None and stored.status is EffectStatus.FAILED
    assert stored.executions == 1
    assert stored.error is not None
    expected = "result_too_large" if size == "over-packet" else "outcome_not_stored"
    assert stored.error.code == expected, stored.error
    assert first.value.field == ("result_size" if size == "over-packet" else "outcome")
