"""The Markdown report never carries terminal controls or bidi overrides raw.

A report is pasted into tickets and read with ``cat``: what an agent wrote
(args, tool names, errors) or a person wrote (names, notes) must not recolour
a terminal, clear it, or reverse the text a reader sees.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore, RunOptions, ToolCall
from agent_ledger.errors import ApprovalPendingError
from agent_ledger.report import render_report

#: ESC/CSI sequences, a C1 CSI, DEL, and the bidi override and isolate marks.
NASTY = "a\x1b[2J\x1b[31m b\x9b31m c\x7f d\u202eevil\u2066e\u200ff\u061c"
RAW = ("\x1b", "\x9b", "\x7f", "\u202e", "\u2066", "\u200f", "\u061c")


async def test_controls_and_bidi_marks_are_escaped_everywhere_in_the_report() -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))
    call = ToolCall(workflow_id=f"w{NASTY}", tool=f"t{NASTY}", args={"note": NASTY})
    with pytest.raises(RuntimeError):
        await ledger.run(call, lambda e: (_ for _ in ()).throw(RuntimeError(NASTY)))
    asked = ToolCall(workflow_id="w", tool="ask", args={NASTY: NASTY}, call_id=NASTY)
    with pytest.raises(ApprovalPendingError):
        await ledger.run(
            asked, lambda e: 1, RunOptions(requires_approval=True, wait_for_approval=False)
        )
    await ledger.deny(ledger.idem_key(asked), reason=NASTY, by=f"ops{NASTY}")
    effects = (await ledger.list_effects()).effects
    text = render_report(effects, generated_at=datetime.now(UTC), filters={"--tool": NASTY})
    assert not [c for c in RAW if c in text]
    assert "\\x1b[2J" in text and "\\x9b31m" in text and "\\u202eevil" in text
