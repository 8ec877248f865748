"""A call's args may be any mapping, not only a dict: it runs and is keyed like the dict."""

from __future__ import annotations

from collections import OrderedDict
from types import MappingProxyType

import pytest

from agent_ledger import (
    EffectLedger,
    EffectLedgerOptions,
    EffectStatus,
    MemoryStore,
    ToolCall,
)


@pytest.mark.parametrize("args", [OrderedDict(b=2, a=1), MappingProxyType({"a": 1, "b": 2})])
async def test_any_mapping_of_args_runs_like_a_dict(args: object) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    call = ToolCall(workflow_id="wf", tool="t", args=args)  # type: ignore[arg-type]
    assert type(call.args) is dict
    assert await ledger.run(call, lambda e: "ran") == "ran"
    same = ToolCall(workflow_id="wf", tool="t", args={"a": 1, "b": 2})
    assert ledger.idem_key(same) == ledger.idem_key(call)
    found = await ledger.find_by_idem_key(ledger.idem_key(call))
    assert found is not None and found.status is EffectStatus.SUCCEEDED
