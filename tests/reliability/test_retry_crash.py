"""A worker killed while it waits to retry: the next owner continues the count.

A worker process (``retry_worker``) runs a call whose handler always fails,
with a policy of 5 tries, and is SIGKILLed during the wait after try 2 (both
tries recorded by then). This test then asks for the same call: once the
dead worker's lease has run out it takes the effect over and must go on at
try 3, never start again at 1, and never make more than 5 tries in all.

Two endings: the taker's handler succeeds at try 4 (after one more failure),
or keeps failing until the policy's 5 tries are used (``retries_exhausted``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agent_ledger import Effect, EffectStatus
from agent_ledger.clock import ManualClock
from agent_ledger.effects import TryFailure
from agent_ledger.testing import build_ledger
from tests.reliability.conftest import report
from tests.reliability.retry_worker import HANG_AFTER, POLICY, call_for, options
from tests.reliability.test_zombie import KINDS, open_stores, records, wait_for
from tests.reliability.zombie_worker import log

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LEASE_MS = 1_000


@pytest.mark.parametrize("ending", ["recovers", "runs out"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_worker_killed_between_tries_is_continued_not_restarted(
    kind: str, ending: str, tmp_path: Path
) -> None:
    url, taker_store = await open_stores(kind, tmp_path)
    clock = ManualClock()  # the taker's waits between tries take no time
    taker = build_ledger(taker_store, defaults=options(LEASE_MS), clock=clock)
    workflow = f"retry-crash-{uuid.uuid4().hex[:8]}"
    call = call_for(workflow)
    log_path, err_path = tmp_path / "events.jsonl", tmp_path / "worker.err"
    with err_path.open("wb") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.retry_worker",
             url, str(log_path), str(LEASE_MS), workflow],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        waiting = await wait_for(
            log_path, lambda r: r["event"] == "backoff" and r["after_try"] == HANG_AFTER, 30
        )
        assert waiting, err_path.read_text()[-2000:]
        before_kill = await taker.find_by_idem_key(taker.idem_key(call))
        os.kill(worker.pid, signal.SIGKILL)
        await asyncio.to_thread(worker.wait, 10)

        async def handler(effect: Effect) -> str:
            number = effect.tries + 1
            log(str(log_path), event="try", who="taker", number=number, attempt=effect.attempt)
            if ending == "recovers" and number == 4:
                return "charged"
            raise ConnectionError("psp still unreachable")

        async with asyncio.timeout(60):
            if ending == "recovers":
                outcome: object = await taker.run(call, handler)
            else:
                with pytest.raises(ConnectionError):
                    await taker.run(call, handler)
                outcome = "raised"
        receipt = await taker.find_by_idem_key(taker.idem_key(call))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        await taker_store.close()

    tries = [
        (r["who"], r["number"], r["attempt"]) for r in records(log_path) if r["event"] == "try"
    ]
    assert before_kill is not None and before_kill.status is EffectStatus.PROCESSING
    assert receipt is not None
    failed = [(t.number, t.attempt) for t in receipt.history if isinstance(t, TryFailure)]
    report(
        f"worker killed while waiting to retry ({kind}, taker {ending})",
        lease_ms=LEASE_MS,
        tries_before_kill=before_kill.tries,
        tries=tries,
        recorded_tries=receipt.tries,
        status=receipt.status.value,
        code=receipt.error.code if receipt.error else None,
    )
    assert before_kill.tries == HANG_AFTER, "both tries were recorded before the wait"
    assert tries[:2] == [("worker", 1, 1), ("worker", 2, 1)]
    assert tries[2][:2] == ("taker", 3), "the next owner resumed at try 3"
    assert len(tries) <= POLICY.attempts and receipt.tries <= POLICY.attempts
    assert receipt.executions == 2 and receipt.attempt == 2
    if ending == "recovers":
        assert outcome == "charged"
        assert tries[2:] == [("taker", 3, 2), ("taker", 4, 2)]
        assert (receipt.status, receipt.result, receipt.tries) == (
            EffectStatus.SUCCEEDED, "charged", 4,
        )  # fmt: skip
        assert failed == [(1, 1), (2, 1), (3, 2)]
        assert clock.slept == [pytest.approx(0.04)], "the taker waited as after try 3"
    else:
        assert tries[2:] == [("taker", 3, 2), ("taker", 4, 2), ("taker", 5, 2)]
        assert (receipt.status, receipt.tries) == (EffectStatus.FAILED, 5)
        assert receipt.error is not None and receipt.error.code == "retries_exhausted"
        assert failed == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
        assert clock.slept == [pytest.approx(0.04), pytest.approx(0.08)]
