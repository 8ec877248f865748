"""A worker process for the cross-process budget test:
`python -m tests.budget_worker --url URL --worker N --log LOG [--start-at T]`.

Makes model calls (a fake provider: each call it reaches appends
"<worker> <n> <micro-dollars>" to --log, the spend being counted) on the
workflow `shared-budget` under a $3.00 budget, until the budget refuses one;
then makes every call it was granted again (replays: nothing may be paid or
booked twice). Prints {"granted": [...], "refused_at": n} as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

import orjson

from agent_ledger import Budget, BudgetExceededError, LLMResult, Usage
from agent_ledger.stores.url import open_store
from agent_ledger.testing import build_ledger

WORKFLOW = "shared-budget"
BUDGET = Budget(usd=3.0)
#: The most one call costs, and every call's estimate: $0.30.
MOST = Usage(input_tokens=100_000, output_tokens=100_000)


def price(provider: str, model: str, usage: Usage) -> float:
    return (usage.input_tokens * 1.0 + usage.output_tokens * 2.0) / 1_000_000


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args(argv)
    rng = random.Random(args.worker)
    store = await open_store(args.url)
    ledger = build_ledger(store)

    async def provider(request: dict[str, int]) -> LLMResult:
        # $0.10, $0.20 or $0.30: never more than the estimate.
        tenths = rng.choice((1, 2, 3))
        usage = Usage(input_tokens=tenths * 100_000 // 3, output_tokens=tenths * 100_000 // 3)
        cost = round(price("fake", "m1", usage) * 1_000_000)
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, f"{args.worker} {request['n']} {cost}\n".encode())
        finally:
            os.close(fd)
        await asyncio.sleep(rng.uniform(0.0, 0.02))
        return LLMResult({"worker": args.worker, "n": request["n"]}, usage)

    async def ask(n: int) -> object:
        reply = await ledger.llm(
            provider,
            provider="fake",
            model="m1",
            request={"worker": args.worker, "n": n},
            pricing=price,
            estimate=MOST,
        )
        return reply.response

    try:
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        granted: list[object] = []
        refused_at = None
        async with ledger.workflow(WORKFLOW, budget=BUDGET):
            for n in range(100):
                try:
                    granted.append(await ask(n))
                except BudgetExceededError:
                    refused_at = n
                    break
            replayed = [await ask(n) for n in range(len(granted))]
        assert replayed == granted, (replayed, granted)
        print(orjson.dumps({"granted": granted, "refused_at": refused_at}).decode(), flush=True)
        return 0
    finally:
        await store.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
