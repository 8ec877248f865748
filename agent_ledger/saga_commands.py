"""``agent-ledger sagas [list|show|recover]``: the saga part of the command line.

Kept here, beside the sagas, so the CLI module only routes to it.
``recover`` needs the tools that undo the steps: ``--app module:attribute``
imports the application's ``EffectLedger`` (the current folder is on the
import path, as for other app runners) and registers its tools on the
command's ledger, whose store is the one ``--url`` names; without it, only
sagas that need no compensation tool are finished, and the others are
reported (and left unclaimed, for a recoverer that has the tools).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.receipt import visible
from agent_ledger.sagas._outcome import read_outcome
from agent_ledger.sagas._report import (
    outcome_to_record,
    render_saga,
    saga_to_record,
    sagas_table,
)
from agent_ledger.sagas._saga import saga_store
from agent_ledger.stores.saga_base import SagaStatus

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger

EXIT_OK, EXIT_NOT_DONE = 0, 1
#: How many sagas ``sagas list`` shows unless ``--limit`` says otherwise.
LIST_LIMIT = 50


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("action", nargs="?", choices=["list", "show", "recover"], default="list")
    sub.add_argument("saga_id", nargs="?", help="show: the saga to show (recover takes none)")
    sub.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in SagaStatus],
        help="list only these statuses (repeatable)",
    )
    sub.add_argument(
        "--limit",
        type=int,
        default=None,
        help="list: show at most this many (default 50); recover: finish at most this many "
        "(default 100)",
    )
    sub.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="recover: the application's EffectLedger, whose tools undo the steps",
    )


def _adopt_tools(ledger: EffectLedger, spec: str) -> None:
    """Register the tools of the application's ledger ``spec`` on ``ledger``."""
    from agent_ledger.ledger import EffectLedger

    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise EffectLedgerValidationError(
            f"--app takes MODULE:ATTRIBUTE (e.g. myshop.agent:ledger), got {spec!r}", field="app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = getattr(importlib.import_module(module), attribute, None)
    except Exception as exc:
        # Whatever importing the application raises (a missing module, a
        # SyntaxError, its own start-up failing): one line naming the module.
        raise EffectLedgerValidationError(
            f"--app {spec}: importing {module!r} failed: {type(exc).__name__}: {visible(str(exc))}",
            field="app",
        ) from exc
    if not isinstance(app, EffectLedger):
        raise EffectLedgerValidationError(
            f"--app {spec}: {attribute!r} in {module} is not an EffectLedger", field="app"
        )
    for tool in app.tools.values():
        ledger.tool(
            tool.name,
            idempotency_keys=tool.idempotency_keys,
            validate_keys=tool.validate_keys,
            requires_approval=tool.requires_approval,
            workflow_id=tool.workflow_id,
            run_options=tool.run_options,
            compensate=tool.compensate,
            compensate_if=tool.compensate_if,
            failure_scope=tool.failure_scope,
        )(tool.fn)


async def sagas_command(
    ledger: EffectLedger,
    args: argparse.Namespace,
    line: Callable[[str], None],
    json: Callable[[object], None],
) -> int:
    store = saga_store(ledger)
    if args.action == "list":
        statuses = None if not args.status else frozenset(SagaStatus(s) for s in args.status)
        limit = LIST_LIMIT if args.limit is None else args.limit
        sagas = await store.list_sagas(statuses=statuses, limit=limit)
        # An open saga may wait for a person on a parked step (an ambiguous attempt).
        waiting = {
            saga.saga_id: (await read_outcome(ledger, store, saga)).parked
            for saga in sagas
            if not saga.status.is_terminal
        }
        if args.json:
            json([{**saga_to_record(s), "parked": list(waiting.get(s.saga_id, ()))} for s in sagas])
        else:
            for text in sagas_table(sagas, waiting):
                line(text)
        return EXIT_OK
    if args.action == "show":
        if not args.saga_id:
            raise EffectLedgerValidationError("sagas show needs a SAGA_ID", field="saga_id")
        saga = await store.get_saga(args.saga_id)
        if saga is None:
            # An error like every other: on stderr, with the CLI's prefix.
            print(f"agent-ledger: no saga '{visible(args.saga_id)}'", file=sys.stderr)
            return EXIT_NOT_DONE
        outcome = await read_outcome(ledger, store, saga)
        if args.json:
            json(outcome_to_record(outcome))
        else:
            line(render_saga(outcome))
        return EXIT_OK
    if args.saga_id is not None:
        # A pass recovers every saga whose owner is gone; naming one would
        # suggest the others are left alone, which they are not.
        raise EffectLedgerValidationError(
            f"sagas recover takes no SAGA_ID (got {visible(args.saga_id)!r}): one pass finishes "
            "every saga whose owner is gone. Run it without the id, or `sagas show ID` to "
            "look at one saga first.",
            field="saga_id",
        )
    if args.app:
        _adopt_tools(ledger, args.app)
    report = await (
        ledger.recover_sagas() if args.limit is None else ledger.recover_sagas(limit=args.limit)
    )
    if args.json:
        json(
            {
                "finished": [outcome_to_record(o) for o in report.finished],
                "abandoned": report.abandoned,
                "running": [saga_to_record(s) for s in report.running],
                "errors": [{"saga_id": i, "error": e} for i, e in report.errors],
            }
        )
    else:
        for outcome in report.finished:
            line(f"finished {visible(outcome.saga_id)}: {outcome.status.value}")
        for saga in report.running:
            owner = visible(saga.owner or "-")
            line(f"running  {visible(saga.saga_id)}: owner {owner} (re-run its code, or wait)")
        for saga_id, error in report.errors:
            line(f"not done {visible(saga_id)}: {visible(error)}")
        if not (report.finished or report.running or report.errors):
            line("no saga needed recovery")
    return EXIT_NOT_DONE if report.errors else EXIT_OK
