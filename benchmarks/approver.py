"""Second process for the approval-wake scenario: approves each key read from stdin
and prints the wall-clock time at which approve() returned."""

from __future__ import annotations

import asyncio
import sys
import time

from agent_ledger import EffectLedger, EffectLedgerOptions, open_store


async def main(url: str) -> None:
    store = await open_store(url)
    ledger = EffectLedger(EffectLedgerOptions(store=store))
    print("ready", flush=True)
    try:
        while key := (await asyncio.to_thread(sys.stdin.readline)).strip():
            await ledger.approve(key)
            print(time.time(), flush=True)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
