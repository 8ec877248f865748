"""A worker process for cross-process tests: `python -m tests.worker MODE --url URL ...`.

run:     run one call through the ledger; the handler appends "<pid> <attempt>" to
         --log (that line is the side effect being counted), sleeps --sleep
         seconds, and returns {"pid": ...}; prints the outcome as JSON.
approve/deny: decide the effect with --idem-key.
--retryable: the handler fails with ConnectionError on attempt 1, declared retryable
         (RunOptions(retryable=...)), so the next call runs it again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import orjson

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerError,
    EffectLedgerOptions,
    LedgerDefaults,
    RunOptions,
    ToolCall,
)
from agent_ledger.options import ConcurrencyOptions, StaleOptions
from agent_ledger.stores.url import open_store

CALL = ToolCall(workflow_id="cross-process", tool="side.effect", args={"n": 1})


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["run", "approve", "deny"])
    parser.add_argument("--url", required=True, help="a store URL, as open_store() takes")
    parser.add_argument("--log", default="")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--after-ms", type=int, default=15_000)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--approval", action="store_true")
    parser.add_argument("--idem-key", default="")
    parser.add_argument("--retryable", action="store_true")
    args = parser.parse_args(argv)

    store = await open_store(args.url)
    ledger = EffectLedger(
        EffectLedgerOptions(
            store=store,
            defaults=LedgerDefaults(
                run=RunOptions(
                    stale=StaleOptions(after_ms=args.after_ms),
                    concurrency=ConcurrencyOptions(
                        wait_timeout_ms=60_000, initial_interval_ms=20, max_interval_ms=200
                    ),
                )
            ),
        )
    )
    try:
        if args.mode == "approve":
            print(orjson.dumps(await ledger.approve(args.idem_key)).decode(), flush=True)
            return 0
        if args.mode == "deny":
            print(orjson.dumps(await ledger.deny(args.idem_key, reason="no")).decode(), flush=True)
            return 0

        async def handler(effect: Effect) -> dict[str, int]:
            # One O_APPEND write per execution: the side effect the tests count.
            fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, f"{os.getpid()} {effect.attempt}\n".encode())
            finally:
                os.close(fd)
            await asyncio.sleep(args.sleep)
            if args.retryable and effect.attempt == 1:
                raise ConnectionError("down on attempt 1")
            return {"pid": os.getpid(), "attempt": effect.attempt}

        # Line the processes up so they really contend.
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        try:
            options = RunOptions(
                requires_approval=args.approval,
                retryable=(ConnectionError,) if args.retryable else None,
            )
            result = await ledger.run(CALL, handler, options)
            print(orjson.dumps({"result": result}).decode(), flush=True)
        except (EffectLedgerError, ConnectionError) as exc:
            print(
                orjson.dumps({"error": type(exc).__name__, "text": str(exc)}).decode(), flush=True
            )
        return 0
    finally:
        await store.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
