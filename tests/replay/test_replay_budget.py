"""Replaying a run its budget stopped (issue 13, second pass).

Before: the replay's budget started empty, so the recorded refusal did not
recur: a strict replay raised a misleading ``UnrecordedEffectError`` for the
call the original refused, and ``strict=False`` ran it, and the next, paying
the provider for calls the original never made. Now the budget the replayed
code declares is simulated from the recording (served calls book their
recorded usage in a replay-local budget; nothing is stored), so the same
call is refused with ``BudgetExceededError`` before anything runs.
"""

from __future__ import annotations

import pytest

from agent_ledger import (
    Budget,
    BudgetExceededError,
    EffectLedger,
    LLMResult,
    MemoryStore,
    Usage,
)
from agent_ledger.testing import build_ledger
from tests.budget_helpers import price
from tests.harness import StoreHarness

W = "agent-replay-13"
#: $0.30 at $1 per million tokens; the estimate is what each call uses.
TURN = Usage(input_tokens=150_000, output_tokens=150_000)


class _Agent:
    def __init__(self, ledger: EffectLedger) -> None:
        self.ledger = ledger
        self.reached: list[int] = []
        self.spent_inside: list[int] = []

    async def model(self, request: dict[str, int]) -> LLMResult:
        self.reached.append(request["t"])
        return LLMResult({"t": request["t"]}, TURN)

    async def run(self) -> list[object]:
        got: list[object] = []
        async with self.ledger.workflow(W, budget=Budget(usd=1.0)):
            try:
                for t in range(5):
                    reply = await self.ledger.llm(
                        self.model,
                        provider="fake",
                        model="m1",
                        request={"t": t},
                        pricing=price,
                        estimate=TURN,
                    )
                    got.append(reply.response["t"])  # type: ignore[index,call-overload]
            except BudgetExceededError:
                got.append("refused")
            state = await self.ledger.budget(W)
            assert state is not None
            self.spent_inside.append(state.spent.usd_micros)
        return got


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "loose"])
async def test_a_replay_is_refused_where_the_recorded_run_was(
    harness: StoreHarness, strict: bool
) -> None:
    original = _Agent(harness.ledger())
    recorded = await original.run()
    assert recorded == [0, 1, 2, "refused"]
    assert original.reached == [0, 1, 2]

    replaying = _Agent(build_ledger(MemoryStore()))
    async with replaying.ledger.replay(W, source=harness.store, strict=strict):
        replayed = await replaying.run()
    assert replayed == recorded
    assert replaying.reached == []  # the provider was never reached
    # Inside the block the budget is the simulated one, spent as the original's.
    assert replaying.spent_inside == [900_000]
    # Nothing was stored: no budget, no effect.
    assert await replaying.ledger.budget(W) is None
    page = await replaying.ledger.list_effects(workflow_id=W, limit=100)
    assert page.effects == []
