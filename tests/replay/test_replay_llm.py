"""A recorded agent run with model calls, tool calls, a failure and a budget,
replayed strictly from its export: model outputs and their usage come from the
recording, no provider or handler is reached, nothing is booked anywhere, and
the export does not change (issue 13: "Record a small agent run ... replay it")."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from agent_ledger import Budget, EffectFailedError, EffectLedger, LLMResult, MemoryStore, Usage
from agent_ledger.errors import UnrecordedEffectError
from agent_ledger.receipt import effect_to_record
from agent_ledger.testing import build_ledger

WORKFLOW = "trip-9"


def price(provider: str, model: str, usage: Usage) -> float:
    return (usage.input_tokens + 4 * usage.output_tokens) / 1_000_000


class Agent:
    """A model picks a city, a tool looks up flights, a booking fails."""

    def __init__(self, ledger: EffectLedger) -> None:
        self.ledger = ledger
        self.reached: list[str] = []  # every provider call and handler run
        reached = self.reached

        async def model(request: dict[str, object]) -> LLMResult:
            reached.append(f"model {request['turn']}")
            text = "Lisbon" if request["turn"] == 1 else "book TP123"
            return LLMResult({"text": text}, Usage(input_tokens=1_000, output_tokens=200))

        self.model = model

        @ledger.tool("flights.search")
        async def search(city: str) -> list[str]:
            reached.append(f"search {city}")
            return ["TP123", "FR9"]

        @ledger.tool("flights.book")
        async def book(flight: str) -> str:
            reached.append(f"book {flight}")
            raise RuntimeError(f"{flight} is full")

        self.search, self.book = search, book

    async def run(self) -> list[object]:
        out: list[object] = []
        async with self.ledger.workflow(WORKFLOW, budget=Budget(usd=1.0, tool_calls=10)):
            for turn in (1, 2):
                reply = await self.ledger.llm(
                    self.model, provider="fake", model="m1", request={"turn": turn},
                    pricing=price, estimate=Usage(2_000, 500),
                )  # fmt: skip
                out.append([reply.response, reply.usage])
                if turn == 1:
                    out.append(await self.search("Lisbon"))
            try:
                await self.book("TP123")
            except RuntimeError as exc:  # the first run: the handler's own error
                out.append(["raised", str(exc)])
            except EffectFailedError as exc:  # every later call: the recorded failure
                out.append(["failed", exc.code, str(exc)])
        return out


async def test_a_run_with_model_calls_replays_from_its_export_reaching_nothing(
    tmp_path: Path,
) -> None:
    recording = build_ledger(MemoryStore())
    original = Agent(recording)
    first = await original.run()
    assert first[-1] == ["raised", "TP123 is full"]
    recorded = await original.run()  # what any later call of the run gets
    assert recorded[:-1] == first[:-1] and recorded[-1][0] == "failed"  # type: ignore[index]
    assert original.reached == ["model 1", "search Lisbon", "model 2", "book TP123"]
    spent = await recording.budget(WORKFLOW)
    assert spent is not None and spent.spent.tool_calls == 2

    page = await recording.list_effects(workflow_id=WORKFLOW, limit=100)
    path = tmp_path / "trip-9.jsonl"
    path.write_bytes(b"".join(orjson.dumps(effect_to_record(e)) + b"\n" for e in page.effects))
    exported = path.read_bytes()

    agent = Agent(build_ledger(MemoryStore()))
    async with agent.ledger.replay(WORKFLOW, source=path):
        replayed = await agent.run()
    assert replayed == recorded
    assert agent.reached == []
    assert path.read_bytes() == exported
    # The usage came from the recording, with its price.
    assert replayed[0] == [{"text": "Lisbon"}, Usage(1_000, 200, cost_usd=0.0018)]
    # A replay books nothing: the budget the replayed code declared was simulated
    # inside the block (issue 13, second pass) and nothing was stored.
    assert await agent.ledger.budget(WORKFLOW) is None

    # A changed model request is refused before the provider is reached.
    changed = Agent(build_ledger(MemoryStore()))
    async with changed.ledger.replay(WORKFLOW, source=path):
        with pytest.raises(UnrecordedEffectError, match=r"llm\.fake"):
            await changed.ledger.llm(
                changed.model, provider="fake", model="m1", request={"turn": 3}, pricing=price
            )
    assert changed.reached == []
