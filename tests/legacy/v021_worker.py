# mypy: ignore-errors
"""Drives the real agent-ledger 0.2.1 (run by its own venv's python, never ours).

``python v021_worker.py DSN SCHEMA COMMAND`` where COMMAND is

* ``scenario``: create 0.2.1's table in SCHEMA and leave one row of every
  kind there (see ``scenario``), printing what each call was as JSON;
* ``key``: read calls as JSON on stdin, print 0.2.1's key for each;
* ``run``: read one call as JSON on stdin and run it through 0.2.1's
  ``EffectLedger.run`` with a handler that sleeps ``sleep_s`` then returns
  ``result``; print ``{"result": ..., "handler_ran": bool}`` or the error;
* ``ops``: read a list of steps as JSON on stdin and apply them in order
  through 0.2.1's public API (see ``ops``), printing one answer per step.

This file imports 0.2.1's ``agent_ledger``, a different package from ours
with the same name, which is why it runs in a separate interpreter.
"""

from __future__ import annotations

import asyncio
import json
import sys

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

import agent_ledger
from agent_ledger import (
    CommitFailed,
    CommitSucceeded,
    ConcurrencyOptions,
    EffectError,
    EffectLedger,
    EffectLedgerOptions,
    ResourceDescriptor,
    RunOptions,
    ToolCall,
    compute_idem_key,
)
from agent_ledger.stores.postgres import SCHEMA_SQL, PostgresStore

assert agent_ledger.__version__ == "0.2.1", agent_ledger.__version__


def tool_call(spec):
    resource = spec.get("resource")
    return ToolCall(
        workflow_id=spec["workflow_id"],
        tool=spec["tool"],
        args=spec.get("args", {}),
        call_id=spec.get("call_id"),
        resource=ResourceDescriptor(**resource) if resource else None,
        idempotency_keys=spec.get("idempotency_keys"),
    )


async def open_ledger(dsn, schema):
    pool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=4,
        open=False,
        kwargs={"row_factory": dict_row, "options": f"-c search_path={schema}"},
    )
    await pool.open()
    return pool, EffectLedger(EffectLedgerOptions(store=PostgresStore(pool)))


SUCCEEDED = [
    (
        {"workflow_id": "wf-1", "tool": "charge", "args": {"amount": 12.5, "to": "acct-1"}},
        {"charged": 0.1 + 0.2, "tiny": 1e-300, "third": 1 / 3, "big": 1e20, "ids": [1, 2.5]},
    ),
    (
        {
            "workflow_id": "wf-3",
            "tool": "create_issue",
            "args": {"body": "generated text"},
            "resource": {"namespace": "github", "type": "issue", "id": {"repo": "acme/app"}},
        },
        {"issue": 17},
    ),
    (
        {
            "workflow_id": "wf-3",
            "tool": "send_email",
            "args": {"to": "a@example.com", "body": "hi", "sent_at": 1700000000},
            "idempotency_keys": ["to"],
        },
        {"queued": True},
    ),
    ({"workflow_id": "wf-4", "tool": "scale", "args": {"factor": 2.5, "n": 3}}, "scaled"),
    # The colliding pair: "team|ops" + "notify" and "team" + "ops|notify" join
    # to the same text, so 0.2.1 gave the second call the first one's receipt.
    ({"workflow_id": "team|ops", "tool": "notify", "args": {"msg": "deploy"}}, {"sent": 1}),
]
COLLIDER = {"workflow_id": "team", "tool": "ops|notify", "args": {"msg": "deploy"}}


async def scenario(dsn, schema):
    pool, ledger = await open_ledger(dsn, schema)
    try:
        async with pool.connection() as conn:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await conn.execute(SCHEMA_SQL)
        calls = []

        def handler_for(value):
            async def handler(effect):
                return value

            return handler

        for spec, result in SUCCEEDED:
            await ledger.run(tool_call(spec), handler_for(result))
            calls.append({"call": spec, "status": "succeeded", "result": result})
        # A repeat of the first call: dedup_count 1 on that row.
        await ledger.run(tool_call(SUCCEEDED[0][0]), handler_for("never"))
        collider_result = await ledger.run(tool_call(COLLIDER), handler_for({"sent": 2}))
        calls.append({"call": COLLIDER, "collider_of": 4, "got_under_021": collider_result})

        failed = {"workflow_id": "wf-1", "tool": "refund", "args": {"charge": "ch_9"}}
        begun = await ledger.begin(tool_call(failed))
        await ledger.commit(
            begun.effect.id, CommitFailed(error=EffectError(message="card expired", code="E42"))
        )
        calls.append({"call": failed, "status": "failed", "error": ["card expired", "E42"]})

        def pending(name):
            return {"workflow_id": "wf-2", "tool": name, "args": {"repo": "acme/" + name}}

        for name, status in (
            ("delete_repo", "denied"),
            ("archive_repo", "requires_approval"),
            ("rename_repo", "ready"),
        ):
            call = tool_call(pending(name))
            await ledger.begin(call)
            assert await ledger.request_approval(compute_idem_key(call))
            if status == "denied":
                assert await ledger.deny(compute_idem_key(call), reason="too risky")
            if status == "ready":
                assert await ledger.approve(compute_idem_key(call))
            calls.append({"call": pending(name), "status": status})

        stuck = {"workflow_id": "wf-5", "tool": "long_job", "args": {"job": 7}}
        await ledger.begin(tool_call(stuck))
        calls.append({"call": stuck, "status": "processing"})
        # A succeeded call begun and committed by hand, as a 0.2.1 begin()/commit() user would.
        manual = {"workflow_id": "wf-6", "tool": "manual", "args": {"x": [1, {"y": None}]}}
        begun = await ledger.begin(tool_call(manual))
        await ledger.commit(begun.effect.id, CommitSucceeded(result=[1, "two", 3.25]))
        calls.append({"call": manual, "status": "succeeded", "result": [1, "two", 3.25]})
        for entry in calls:
            entry["key021"] = compute_idem_key(tool_call(entry["call"]))
        print(json.dumps(calls))
    finally:
        await pool.close()


async def run_one(dsn, schema, spec):
    pool, ledger = await open_ledger(dsn, schema)
    ran = []

    async def handler(effect):
        ran.append(True)
        await asyncio.sleep(spec.get("sleep_s", 0))
        return spec["result"]

    options = RunOptions(concurrency=ConcurrencyOptions(effect_timeout_s=60.0))
    try:
        result = await ledger.run(tool_call(spec["call"]), handler, run_options=options)
        print(json.dumps({"result": result, "handler_ran": bool(ran)}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    finally:
        await pool.close()


async def ops(dsn, schema, steps):
    """Steps: ``init`` (0.2.1's table), ``run`` (call, result: a handler
    returning it), ``begin``, ``succeed`` (result) / ``fail`` (error: [message,
    code]) by hand, ``request_approval``, ``approve``, ``deny`` (reason)."""
    pool, ledger = await open_ledger(dsn, schema)
    out = []
    try:
        for step in steps:
            kind = step["op"]
            if kind == "init":
                async with pool.connection() as conn:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                    await conn.execute(SCHEMA_SQL)
                out.append(None)
                continue
            call = tool_call(step["call"])
            key = compute_idem_key(call)
            if kind == "run":

                async def handler(effect, _result=step["result"]):
                    return _result

                out.append(await ledger.run(call, handler))
            elif kind == "begin":
                out.append(str((await ledger.begin(call)).effect.id))
            elif kind in ("succeed", "fail"):
                effect = await ledger._store.find_by_idem_key(key)
                outcome = (
                    CommitSucceeded(result=step["result"])
                    if kind == "succeed"
                    else CommitFailed(error=EffectError(*step["error"]))
                )
                await ledger.commit(effect.id, outcome)
                out.append(str(effect.id))
            elif kind == "request_approval":
                out.append(bool(await ledger.request_approval(key)))
            elif kind == "approve":
                out.append(bool(await ledger.approve(key)))
            elif kind == "deny":
                out.append(bool(await ledger.deny(key, reason=step.get("reason"))))
            else:
                raise SystemExit(f"unknown step {kind}")
    finally:
        await pool.close()
    print(json.dumps(out))


def main():
    dsn, schema, command = sys.argv[1:4]
    if command == "scenario":
        asyncio.run(scenario(dsn, schema))
    elif command == "key":
        specs = json.loads(sys.stdin.read())
        print(json.dumps([compute_idem_key(tool_call(spec)) for spec in specs]))
    elif command == "run":
        asyncio.run(run_one(dsn, schema, json.loads(sys.stdin.read())))
    elif command == "ops":
        asyncio.run(ops(dsn, schema, json.loads(sys.stdin.read())))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
