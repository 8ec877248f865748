"""scope="workflow" | "turn" | "call": what else, besides the args, makes two calls one.

Keys of ``scope="workflow"`` (the default) are byte-for-byte those of every
earlier release: the digests below were computed by the previous release's
``agent_ledger.keys`` (and its 0.2.x ``legacy`` keys), so a receipt stored
before this change still answers the same call after it.
"""

from __future__ import annotations

import hashlib

import pytest

from agent_ledger import EffectLedgerValidationError, ToolCall
from agent_ledger.calls import ResourceDescriptor
from agent_ledger.keys import KEY_VERSION, canonical_json, idempotency_key
from agent_ledger.legacy.keys import legacy_key_or_none

#: (call, its key, its 0.2.x key), as the release before scopes computed them.
BEFORE_SCOPES = [
    (
        ToolCall("thread-1", "mail.send", {"to": "ada", "n": 1}),
        "dedbbbc87285a929e8078c2ce954950fb39fd6179de92984a7ccd4e912771963",
        "e288e7a22b2b18cdbdee0c7adda8d6bbf4230922cc91ea2d10a7423f2229eb81",
    ),
    (
        ToolCall("wf", "t", {"a": [1, 2.5, None], "b": {"x": True}}, call_id="call_9"),
        "8c2061b4f1fd781d4da03a90a603e8d2573f513901cf578e1f32178a98a9b852",
        "4bf7532c0a539170b672a76ec25dc76893222e161d1e50979e6741062a300307",
    ),
    (
        ToolCall("wf", "t", {"a": 1, "b": 2}, idempotency_keys=["a"]),
        "ae427c807feb972b261452a1123d612c6abd5b535d9b14ceb60f3b00bab4b08f",
        "997da5248485b7acfb1792a96bc19a95b4c53bc48af5075870ed16460c713c15",
    ),
    (
        ToolCall("wf", "t", {}, resource=ResourceDescriptor("gh", "issue", {"n": 7})),
        "651ea3b015a2720b630f2fdcf54929204a8fd26cf4b162ae0d0f45462dcbd660",
        "ad46aa68f27f3daf93f62e7a0336b20cfa6fc0dbd73247717fc12850248e7dc4",
    ),
]


@pytest.mark.parametrize(("call", "key", "legacy"), BEFORE_SCOPES)
def test_workflow_scope_keys_are_unchanged(call: ToolCall, key: str, legacy: str) -> None:
    """The default scope, and an explicit "workflow", keep the previous release's keys;
    a turn recorded on a workflow-scoped call changes nothing either."""
    assert call.scope == "workflow"
    assert idempotency_key(call) == key
    assert legacy_key_or_none(call) == legacy
    explicit = ToolCall(
        call.workflow_id,
        call.tool,
        call.args,
        call_id=call.call_id,
        resource=call.resource,
        idempotency_keys=call.idempotency_keys,
        scope="workflow",
        turn="turn-7",
    )
    assert idempotency_key(explicit) == key


def test_turn_and_call_scopes_add_a_sixth_element() -> None:
    """The documented material: the five elements, then ["turn", id] or ["call", id]."""
    args = {"to": "ada"}
    five = f'["{KEY_VERSION}","wf","mail.send","args",{canonical_json(args, field="a").decode()}'
    turn = ToolCall("wf", "mail.send", args, scope="turn", turn="t-1")
    call = ToolCall("wf", "mail.send", args, scope="call", call_id="call_1")
    assert idempotency_key(turn) == hashlib.sha256(f'{five},["turn","t-1"]]'.encode()).hexdigest()
    assert (
        idempotency_key(call) == hashlib.sha256(f'{five},["call","call_1"]]'.encode()).hexdigest()
    )


def test_each_scope_separates_what_it_should() -> None:
    """turn: same args in another turn is another effect, the same turn the same one;
    call: per call_id; workflow: neither matters; no scope collides with another."""
    args = {"to": "ada"}

    def key(**kw: object) -> str:
        return idempotency_key(ToolCall("wf", "remind", args, **kw))  # type: ignore[arg-type]

    assert key(scope="turn", turn="1") == key(scope="turn", turn="1", call_id="x")
    assert key(scope="turn", turn="1") != key(scope="turn", turn="2")
    assert key(scope="call", call_id="a") == key(scope="call", call_id="a", turn="9")
    assert key(scope="call", call_id="a") != key(scope="call", call_id="b")
    assert key() == key(turn="1") == key(turn="2", call_id="c")
    # The same id under two scopes, and either against the workflow: four keys.
    assert len({key(), key(scope="turn", turn="x"), key(scope="call", call_id="x")}) == 3


def test_a_scope_without_its_id_is_refused_naming_the_remedy() -> None:
    """Never a silent fallback to the workflow scope."""
    with pytest.raises(EffectLedgerValidationError, match=r"turn=\.\.\.") as turn:
        idempotency_key(ToolCall("wf", "remind", {}, scope="turn"))
    assert turn.value.field == "turn"
    with pytest.raises(EffectLedgerValidationError, match="call_id") as call:
        idempotency_key(ToolCall("wf", "remind", {}, scope="call"))
    assert call.value.field == "call_id"


@pytest.mark.parametrize("scope", ["session", "", None, 3, "Turn"])
def test_an_unknown_scope_is_refused(scope: object) -> None:
    with pytest.raises(EffectLedgerValidationError, match="scope must be one of") as info:
        ToolCall("wf", "t", scope=scope)  # type: ignore[arg-type]
    assert info.value.field == "scope"


@pytest.mark.parametrize("turn", ["", "  ", "a\x00b", "x" * 501, 7])
def test_a_bad_turn_is_refused(turn: object) -> None:
    with pytest.raises(EffectLedgerValidationError) as info:
        ToolCall("wf", "t", turn=turn)  # type: ignore[arg-type]
    assert info.value.field == "turn"
