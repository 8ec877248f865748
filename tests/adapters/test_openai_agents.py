"""OpenAI Agents SDK adapter: a real Runner, a scripted model, every store."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import orjson
import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    Runner,
    RunResult,
    RunState,
    Tool,
    ToolCallOutputItem,
    Usage,
    UserError,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from agent_ledger import (
    ApprovalPendingError,
    Budget,
    BudgetExceededError,
    Effect,
    EffectLedger,
    EffectLedgerValidationError,
    EffectStatus,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.adapters.openai_agents import (
    RUN_STATE,
    LedgerFunctionTool,
    approve,
    as_function_tool,
    as_function_tools,
    reject,
    sync_decisions,
)
from agent_ledger.errors import UnrecordedEffectError
from agent_ledger.testing import build_ledger
from tests.harness import StoreHarness

NO_TRACING = RunConfig(tracing_disabled=True)


class ScriptedModel(Model):
    """The SDK's ``Model``, answering each turn from a script: no network, no LLM.

    ``inputs`` keeps what the runner sent each turn, so a test can read what
    the model was told (the tool outputs it got back).
    """

    def __init__(self, *turns: Sequence[TResponseOutputItem]) -> None:
        self.turns = [list(turn) for turn in turns]
        self.inputs: list[str | list[TResponseInputItem]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        self.inputs.append(input)
        assert self.turns, "the runner asked the model more often than scripted"
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("these tests do not stream")


def call(name: str, arguments: dict[str, object] | str, call_id: str) -> ResponseFunctionToolCall:
    """A function call the model makes, as the Responses API returns it."""
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return ResponseFunctionToolCall(
        type="function_call", name=name, arguments=text, call_id=call_id, id=f"fc_{call_id}"
    )


def say(text: str) -> ResponseOutputMessage:
    """The model's final message."""
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def outputs(result: RunResult) -> dict[str, object]:
    """Each tool output of the run by the call id it answers."""
    found: dict[str, object] = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            assert item.call_id is not None and item.call_id not in found
            found[item.call_id] = item.output
    return found


def returned(model: ScriptedModel) -> dict[str, object]:
    """The tool outputs the model was sent in its last turn, by call id."""
    sent = model.inputs[-1]
    assert isinstance(sent, list)
    found: dict[str, object] = {}
    for item in sent:
        entry = cast(Mapping[str, Any], item)
        if entry.get("type") == "function_call_output":
            found[entry["call_id"]] = entry["output"]
    return found


def charge_ledger(harness: StoreHarness, **options: Any) -> tuple[EffectLedger, list[int]]:
    """A ledger with one tool, ``payments.charge``, and the list of amounts it charged."""
    ledger = harness.ledger()
    charged: list[int] = []

    @ledger.tool("payments.charge", idempotency_keys=["order_id"], **options)
    async def charge(order_id: str, amount: int, *, effect: Effect) -> dict[str, object]:
        """Charge an order.

        Args:
            order_id: The order to charge.
            amount: In cents.
        """
        charged.append(amount)
        return {"order": order_id, "charged": amount, "ref": effect.idem_key[:8]}

    return ledger, charged


async def the_effect(ledger: EffectLedger, workflow: str, **args: object) -> Effect:
    """The workflow's one ``payments.charge`` effect with these args (any turn)."""
    page = await ledger.list_effects(workflow_id=workflow, tool="payments.charge")
    (effect,) = [e for e in page.effects if e.args == args]
    return effect


# -- conversion ----------------------------------------------------------------------------


def test_the_schema_comes_from_the_signature_without_effect() -> None:
    """Parameters (and their docstring descriptions) make the schema; ``effect`` is not one."""
    ledger = build_ledger_for_schema()
    tool = as_function_tool(ledger.tools["payments.charge"])
    assert isinstance(tool, LedgerFunctionTool)
    assert tool.name == "payments_charge"  # '.' is not allowed in an OpenAI function name
    assert tool.description == "Charge an order."
    schema = tool.params_json_schema
    assert set(schema["properties"]) == {"order_id", "amount", "currency"}
    assert schema["properties"]["amount"]["type"] == "integer"
    assert schema["properties"]["amount"]["description"] == "In cents."
    assert sorted(schema["required"]) == ["amount", "currency", "order_id"]  # strict mode
    assert schema["additionalProperties"] is False
    assert tool.needs_approval is False  # no approval policy, so the SDK never asks

    loose = as_function_tool(
        ledger.tools["payments.charge"], name="charge", description="Take money.", strict_mode=False
    )
    assert loose.name == "charge" and loose.description == "Take money."
    assert sorted(loose.params_json_schema["required"]) == ["amount", "order_id"]


def build_ledger_for_schema() -> EffectLedger:
    from agent_ledger import MemoryStore

    ledger = build_ledger(MemoryStore())

    @ledger.tool("payments.charge")
    async def charge(order_id: str, amount: int, currency: str = "EUR", *, effect: Effect) -> str:
        """Charge an order.

        Args:
            order_id: The order to charge.
            amount: In cents.
            currency: ISO code.
        """
        return "ok"

    @ledger.tool("payments/refund")
    def refund(order_id: str, /) -> str:
        return "refunded"

    @ledger.tool("payments:refund")
    def other_refund(order_id: str) -> str:
        return "refunded"

    return ledger


def test_as_function_tools_converts_all_or_the_named_ones() -> None:
    """Registration order by default; names or tools to choose; clashes and strangers refused."""
    ledger = build_ledger_for_schema()
    with pytest.raises(EffectLedgerValidationError, match="would both be called 'payments_refund'"):
        as_function_tools(ledger)
    chosen = as_function_tools(ledger, ["payments.charge", ledger.tools["payments/refund"]])
    assert all(isinstance(t, LedgerFunctionTool) for t in chosen)
    assert [(t.name, t.ledger_tool.name) for t in chosen if isinstance(t, LedgerFunctionTool)] == [
        ("payments_charge", "payments.charge"),
        ("payments_refund", "payments/refund"),
    ]

    with pytest.raises(EffectLedgerValidationError, match="no tool named 'nope'"):
        as_function_tools(ledger, ["nope"])
    with pytest.raises(EffectLedgerValidationError, match="list of tool names"):
        as_function_tools(ledger, "payments.charge")
    stranger = build_ledger_for_schema().tools["payments.charge"]
    with pytest.raises(EffectLedgerValidationError, match="another ledger"):
        as_function_tools(ledger, [stranger])
    with pytest.raises(EffectLedgerValidationError, match="not a name the OpenAI API accepts"):
        as_function_tool(ledger.tools["payments.charge"], name="pay money")
    with pytest.raises(EffectLedgerValidationError, match=r"registered with @ledger\.tool"):
        as_function_tool(print)  # type: ignore[arg-type]


# -- runs ------------------------------------------------------------------------------------


async def test_five_duplicate_calls_run_once_and_each_output_keeps_its_call_id(
    harness: StoreHarness,
) -> None:
    """One turn, five identical calls under five ids: one charge, five outputs, one per id."""
    ledger, charged = charge_ledger(harness)
    ids = [f"call_{n}" for n in range(5)]
    model = ScriptedModel(
        [call("payments_charge", {"order_id": "o42", "amount": 4999}, i) for i in ids],
        [say("charged once")],
    )
    agent = Agent(name="shop", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow("order-42"):
        result = await Runner.run(agent, "charge order 42", run_config=NO_TRACING)

    assert result.final_output == "charged once"
    assert charged == [4999]
    effect = await the_effect(ledger, "order-42", order_id="o42", amount=4999)
    assert effect.status is EffectStatus.SUCCEEDED and effect.executions == 1
    assert effect.call_id in ids and effect.dedup_count == 4
    got = outputs(result)
    assert sorted(got) == ids
    expected = orjson.dumps(
        {"charged": 4999, "order": "o42", "ref": effect.idem_key[:8]},
        option=orjson.OPT_SORT_KEYS,
    ).decode()
    assert all(output == expected for output in got.values())
    # What the model got back: five function_call_output items, each with its own id.
    assert returned(model) == dict.fromkeys(ids, expected)


async def test_a_later_run_replays_the_stored_result(harness: StoreHarness) -> None:
    """Another run of the same workflow, another id: the stored result, no second charge."""
    ledger, charged = charge_ledger(harness)
    tools = as_function_tools(ledger)
    texts = []
    for run in range(2):
        model = ScriptedModel(
            [call("payments_charge", {"order_id": "o7", "amount": 100}, f"run{run}")],
            [say("done")],
        )
        async with ledger.workflow("order-7"):
            result = await Runner.run(
                Agent(name="shop", model=model, tools=tools), "go", run_config=NO_TRACING
            )
        texts.append(outputs(result)[f"run{run}"])
    assert charged == [100]
    # The later run reads the stored result, said to be from an earlier run (no history in
    # the input, so the ledger cannot tell a repeat from a retry: it says what it did).
    later = str(texts[1])
    assert later.startswith("Already done at ") and ", in an earlier run (receipt " in later
    assert later.endswith(f"Its result then: {texts[0]}")


async def test_malformed_arguments_store_nothing_and_tell_the_model(harness: StoreHarness) -> None:
    """Bad JSON, wrong types, unknown or missing parameters: an error the model reads, no effect."""
    ledger, charged = charge_ledger(harness)
    model = ScriptedModel(
        [
            call("payments_charge", '{"order_id": "o1", "amount": 5', "bad_json"),
            call("payments_charge", "[1, 2]", "not_object"),
            call("payments_charge", {"order_id": "o1", "amount": "lots"}, "wrong_type"),
            call("payments_charge", {"order_id": "o1", "amount": 5, "tip": 1}, "unknown"),
            call("payments_charge", {"order_id": "o1"}, "missing"),
            call("payments_charge", {"order_id": "o1", "amount": True}, "bool_for_int"),
        ],
        [say("I will fix my arguments")],
    )
    agent = Agent(name="shop", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow("order-1"):
        result = await Runner.run(agent, "charge", run_config=NO_TRACING)

    assert result.final_output == "I will fix my arguments"
    got = outputs(result)
    assert "not valid JSON" in str(got["bad_json"])
    assert "must be a JSON object" in str(got["not_object"])
    assert "amount: Input should be a valid integer" in str(got["wrong_type"])
    assert "amount: Input should be a valid integer" in str(got["bool_for_int"])
    assert "unexpected keyword argument 'tip'" in str(got["unknown"])
    assert "amount: Field required" in str(got["missing"])
    assert charged == []
    assert await harness.raw_count() == 0


def never(tool_call: ToolCall) -> bool:
    return False


@pytest.mark.parametrize(
    "policy", [None, never, True], ids=["no-policy", "policy-says-no", "always"]
)
async def test_numbers_the_ledger_cannot_key_exactly_are_refused_with_or_without_a_policy(
    harness: StoreHarness, policy: object
) -> None:
    """``Any``, ``float`` and untyped parameters: an integer beyond 64 bits (which a float
    would round, so two calls would share a key) or a number beyond a float is refused
    as a message for the model, nothing stored, with or without an approval policy (the
    policy's question used to crash the run); 64-bit integers reach the tool and the key
    exactly."""
    ledger = harness.ledger()
    got: list[tuple[object, object, object]] = []

    @ledger.tool("ref.lookup", requires_approval=policy)  # type: ignore[arg-type]
    async def lookup(ref: Any, amount: float, note) -> str:  # type: ignore[no-untyped-def]
        got.append((ref, amount, note))
        return "found"

    def args(ref: str = "1", amount: str = "1.5", note: str = '"n"') -> str:
        return f'{{"ref": {ref}, "amount": {amount}, "note": {note}}}'

    bad = {
        "ref_2_64": args(ref="18446744073709551616"),
        "ref_2_64_plus_1": args(ref="18446744073709551617"),
        "ref_nested": args(ref='{"id": [-9223372036854775809]}'),
        "amount_big": args(amount="99999999999999999999999"),
        "amount_inf": args(amount="1e999"),
        "note_big": args(note="99999999999999999999999"),
    }
    good = args(ref="18446744073709551615", amount="9007199254740993", note="-9223372036854775808")
    model = ScriptedModel(
        [call("ref_lookup", raw, name) for name, raw in bad.items()]
        + [call("ref_lookup", good, "good")],
        [say("done")],
    )
    agent = Agent(name="a", model=model, tools=[as_function_tool(lookup, strict_mode=False)])
    async with ledger.workflow("w"):
        result = await Runner.run(agent, "go", run_config=NO_TRACING)

    answers = outputs(result)
    for name in ("ref_2_64", "ref_2_64_plus_1", "ref_nested", "amount_big", "note_big"):
        assert "beyond 64 bits" in str(answers[name]), name
    assert "Infinity" in str(answers["amount_inf"])
    if policy is True:
        assert [i.call_id for i in result.interruptions] == ["good"]
        assert got == [] and await harness.raw_count() == 1
        [waiting] = await ledger.pending_approvals()
        assert waiting.args == {
            "ref": 18446744073709551615,
            "amount": 9007199254740993,
            "note": -9223372036854775808,
        }
        return
    assert result.interruptions == [] and answers["good"] == "found"
    # Exactly what the model sent: no float on the way (2**53 + 1 stays odd).
    assert got == [(18446744073709551615, 9007199254740993, -9223372036854775808)]
    assert [type(v) for v in got[0]] == [int, int, int]
    [stored] = (await ledger.list_effects()).effects
    assert stored.args == {
        "ref": 18446744073709551615,
        "amount": 9007199254740993,
        "note": -9223372036854775808,
    }


async def test_a_malformed_call_reads_the_same_with_or_without_an_approval_policy(
    harness: StoreHarness,
) -> None:
    """The policy's question never crashes the run: the model reads what a tool without
    a policy would answer, and nothing is stored or paused."""
    raw = '{"order_id": "o1", "amount": 1180591620717411303424}'
    texts = []
    for workflow, policy in (("plain", None), ("gated", big), ("always", True)):
        ledger, charged = charge_ledger(harness, requires_approval=policy)
        _, _, result = await interrupted(
            ledger, workflow, [call("payments_charge", raw, "c1")], [say("fixing it")]
        )
        assert result.final_output == "fixing it" and result.interruptions == []
        assert charged == []
        texts.append(outputs(result)["c1"])
    assert "beyond 64 bits" in str(texts[0]) and texts[0] == texts[1] == texts[2]
    assert await harness.raw_count() == 0


async def test_a_tool_failure_reaches_the_model_through_failure_error_function(
    harness: StoreHarness,
) -> None:
    """The application's formatter words every failure, first call and replay; with the
    SDK's default one, a final failure reads as the ledger's words (failed, recorded,
    sending it again gives the same answer), never "please try again"."""
    ledger = harness.ledger()
    tries: list[str] = []

    @ledger.tool("flaky")
    def flaky(x: int) -> int:
        tries.append("ran")
        raise ValueError(f"bad x {x}")

    async def explain(ctx: Any, error: Exception) -> str:  # sync ones work too (the default)
        return f"failed: {type(error).__name__}: {error}"

    custom = as_function_tool(ledger.tools["flaky"], failure_error_function=explain)
    model = ScriptedModel(
        [call("flaky", {"x": 1}, "a")], [call("flaky", {"x": 1}, "b")], [say("gave up")]
    )
    async with ledger.workflow("w"):
        result = await Runner.run(
            Agent(name="a", model=model, tools=[custom]), "go", run_config=NO_TRACING
        )
    got = outputs(result)
    assert got["a"] == "failed: ValueError: bad x 1"
    assert str(got["b"]).startswith("failed: EffectFailedError") and "bad x 1" in str(got["b"])
    assert tries == ["ran"]

    default = as_function_tool(ledger.tools["flaky"])
    model = ScriptedModel([call("flaky", {"x": 2}, "c")], [say("gave up")])
    async with ledger.workflow("w"):
        result = await Runner.run(
            Agent(name="a", model=model, tools=[default]), "go", run_config=NO_TRACING
        )
    text = str(outputs(result)["c"])
    assert text.startswith("This call failed (ValueError: bad x 2; effect ")
    assert "calling again with the same arguments gives this answer" in text
    assert "Please try again" not in text

    raising = as_function_tool(ledger.tools["flaky"], failure_error_function=None)
    model = ScriptedModel([call("flaky", {"x": 3}, "d")])
    async with ledger.workflow("w"):
        with pytest.raises(UserError) as caught:
            await Runner.run(
                Agent(name="a", model=model, tools=[raising]), "go", run_config=NO_TRACING
            )
    assert isinstance(caught.value.__cause__, ValueError)
    assert tries == ["ran", "ran", "ran"]


async def test_a_nested_ledger_error_is_the_tools_failure_first_and_on_replay(
    harness: StoreHarness,
) -> None:
    """Regression: a tool whose own tool call was denied told the model "A person denied
    this call... It did not run" on the first call (it ran, and failed), and one whose
    own tool call had bad arguments showed the nested validation error; every replay
    read the failure text. Both are the tool's failure, every time."""
    ledger = harness.ledger()
    cleaned: list[str] = []

    @ledger.tool("db.drop", requires_approval=True)
    async def drop(table: str) -> str:
        return f"dropped {table}"

    @ledger.tool("db.cleanup", scope="workflow")  # keyed as the direct calls below
    async def cleanup(name: str) -> str:
        cleaned.append(name)  # a side effect that did happen
        return await drop(f"{name}.tmp")

    @ledger.tool("db.vacuum", scope="workflow")
    async def vacuum(name: str) -> str:
        cleaned.append(name)
        return await drop(tabel=name)  # a bug: the nested call's arguments are refused

    model = ScriptedModel(
        [call("db_cleanup", {"name": "s"}, "a"), call("db_vacuum", {"name": "v"}, "b")],
        [call("db_cleanup", {"name": "s"}, "c"), call("db_vacuum", {"name": "v"}, "d")],
        [say("done")],
    )
    agent = Agent(
        name="a", model=model, tools=as_function_tools(ledger, ["db.cleanup", "db.vacuum"])
    )
    async with ledger.workflow("w"):
        with pytest.raises(ApprovalPendingError) as pending:
            await drop.invoke({"table": "s.tmp"}, run_options=RunOptions(wait_for_approval=False))
        assert await ledger.deny(pending.value.idem_key, reason="keep it", by="ada")
        result = await Runner.run(agent, "go", run_config=NO_TRACING)
        outer = [
            await ledger.find_by_idem_key(ledger.idem_key(t.tool_call(n)))
            for t, n in ((cleanup, "s"), (vacuum, "v"))
        ]
    got = outputs(result)
    assert got["a"] == got["c"] and got["b"] == got["d"]
    assert str(got["a"]).startswith("This call failed (EffectDeniedError: ")
    assert str(got["b"]).startswith("This call failed (EffectLedgerValidationError: ")
    # The two calls of one model turn run concurrently: each ran once, in either order.
    assert sorted(cleaned) == ["s", "v"]
    assert [e.error.code if e is not None and e.error else None for e in outer] == [
        "EffectDeniedError",
        "EffectLedgerValidationError",
    ]


async def test_a_run_outside_a_workflow_raises_and_stores_nothing(harness: StoreHarness) -> None:
    """No ledger.workflow() around the run: the application's mistake, so the run stops."""
    ledger, charged = charge_ledger(harness)
    model = ScriptedModel([call("payments_charge", {"order_id": "o", "amount": 1}, "x")])
    agent = Agent(name="shop", model=model, tools=as_function_tools(ledger))
    with pytest.raises(UserError) as caught:
        await Runner.run(agent, "go", run_config=NO_TRACING)
    assert isinstance(caught.value.__cause__, EffectLedgerValidationError)
    assert "outside a workflow" in str(caught.value.__cause__)
    assert charged == [] and await harness.raw_count() == 0


async def test_a_payload_mismatch_is_explained_to_the_model(harness: StoreHarness) -> None:
    """Same order, another amount: not run; the model is told what the earlier call used."""
    ledger, charged = charge_ledger(harness, validate_keys=["amount"])
    model = ScriptedModel(
        [call("payments_charge", {"order_id": "o9", "amount": 10}, "first")],
        [call("payments_charge", {"order_id": "o9", "amount": 99}, "second")],
        [say("ok")],
    )
    async with ledger.workflow("w"):
        result = await Runner.run(
            Agent(name="shop", model=model, tools=as_function_tools(ledger)),
            "go",
            run_config=NO_TRACING,
        )
    second = str(outputs(result)["second"])
    assert "amount=10" in second and "was not run" in second
    assert charged == [10]


# -- approvals -------------------------------------------------------------------------------


def big(tool_call: ToolCall) -> bool:
    amount = tool_call.args["amount"]
    return isinstance(amount, int) and amount > 1000


async def interrupted(
    ledger: EffectLedger, workflow: str, *turns: Sequence[TResponseOutputItem]
) -> tuple[Agent[Any], ScriptedModel, RunResult]:
    model = ScriptedModel(*turns)
    agent = Agent(name="shop", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow(workflow):
        result = await Runner.run(agent, "charge", run_config=NO_TRACING)
    return agent, model, result


async def test_approval_round_trip_pauses_then_runs_once(harness: StoreHarness) -> None:
    """Policy says a person decides: the run pauses, the ledger holds the request,
    approve() records who approved, and the resumed run (from saved state) runs it once."""
    ledger, charged = charge_ledger(harness, requires_approval=big)
    agent, _, result = await interrupted(
        ledger,
        "order-5",
        [call("payments_charge", {"order_id": "o5", "amount": 5000}, "ask")],
        [say("charged after approval")],
    )
    assert charged == [] and result.final_output is None
    [item] = result.interruptions
    [pending] = await ledger.pending_approvals()
    assert pending.call_id == "ask" and pending.args == {"order_id": "o5", "amount": 5000}

    # The state travels (a database, a queue) while a person decides.
    saved = result.to_state().to_string()
    state: RunState[Any, Any] = await RunState.from_string(agent, saved)
    [item] = state.get_interruptions()
    async with ledger.workflow("order-5"):
        effect = await approve(state, item, by="ada", note="known customer")
        assert effect is not None and effect.status is EffectStatus.READY
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)

    assert resumed.final_output == "charged after approval"
    assert charged == [5000]
    done = await the_effect(ledger, "order-5", order_id="o5", amount=5000)
    assert done.status is EffectStatus.SUCCEEDED and done.executions == 1
    assert (done.decided_by, done.decision_note) == ("ada", "known customer")
    assert "5000" in str(outputs(resumed)["ask"])


async def test_small_calls_pass_while_big_ones_pause(harness: StoreHarness) -> None:
    """The policy is asked per call: under the limit runs at once, over it waits."""
    ledger, charged = charge_ledger(harness, requires_approval=big)
    _, _, result = await interrupted(
        ledger,
        "w",
        [
            call("payments_charge", {"order_id": "small", "amount": 10}, "s"),
            call("payments_charge", {"order_id": "big", "amount": 10_000}, "b"),
        ],
    )
    assert charged == [10]
    assert [i.call_id for i in result.interruptions] == ["b"]
    assert "small" in str(outputs(result)["s"])


async def test_a_rejected_call_sent_again_runs_nothing(harness: StoreHarness) -> None:
    """reject() denies on the ledger; the model hears why, and a re-sent call is refused."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "order-6",
        [
            call("payments_charge", {"order_id": "o6", "amount": 50}, "first"),
            call("payments_charge", {"order_id": "o8", "amount": 70}, "other"),
        ],
        [call("payments_charge", {"order_id": "o6", "amount": 50}, "again")],
        [say("the charge was refused")],
    )
    state = result.to_state()
    first, other = result.interruptions
    async with ledger.workflow("order-6"):
        effect = await reject(state, first, by="bob", reason="card flagged")
        assert effect is not None and effect.status is EffectStatus.DENIED
        assert await reject(state, other, by="bob") is not None  # no reason given
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)

    assert resumed.final_output == "the charge was refused"
    assert resumed.interruptions == []  # denied: nothing left for a person
    got = outputs(resumed)
    assert "A person denied this call (card flagged)" in str(got["first"])
    assert got["again"] == got["first"]
    assert got["other"] == (
        "A person denied this call. It did not run and will not; do not send it again."
    )
    assert charged == []
    denied = await the_effect(ledger, "order-6", order_id="o6", amount=50)
    assert denied.status is EffectStatus.DENIED and denied.decided_by == "bob"
    assert denied.executions == 0


async def test_state_approve_approves_the_ledger_effect_and_it_runs_once(
    harness: StoreHarness,
) -> None:
    """state.approve(item), the SDK's own approval: on resuming, the waiting effect is
    approved on the ledger (decided_by: the documented default, or the app's function of
    the run context) and runs once; the run never raises, nothing is left pending."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "w",
        [call("payments_charge", {"order_id": "o", "amount": 1}, "c")],
        [say("charged")],
    )
    state = result.to_state()
    state.approve(result.interruptions[0])
    async with ledger.workflow("w"):
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    assert resumed.final_output == "charged" and charged == [1]
    effect = await the_effect(ledger, "w", order_id="o", amount=1)
    assert effect.status is EffectStatus.SUCCEEDED and effect.executions == 1
    assert effect.decided_by == RUN_STATE == "openai-agents run state"

    # Who decided, from the application's own context object.
    ledger2, charged2 = charge_ledger(harness, requires_approval=True)
    named = as_function_tools(ledger2, decided_by=lambda ctx: ctx.context["user"])
    model = ScriptedModel(
        [call("payments_charge", {"order_id": "p", "amount": 2}, "d")], [say("ok")]
    )
    agent2 = Agent(name="a", model=model, tools=named)
    async with ledger2.workflow("w2"):
        first = await Runner.run(agent2, "go", context={"user": "ada"}, run_config=NO_TRACING)
        state2 = first.to_state()
        state2.approve(first.interruptions[0])
        await Runner.run(agent2, state2, run_config=NO_TRACING)
    assert charged2 == [2]
    approved = await the_effect(ledger2, "w2", order_id="p", amount=2)
    assert approved.decided_by == "ada"


async def test_state_reject_denies_the_ledger_effect(harness: StoreHarness) -> None:
    """state.reject(item), the SDK's own rejection (the SDK answers the model itself and
    never invokes the tool): the ledger effect is denied, with the rejection message as
    the reason and decided_by, not left pending for ever; sent again, it reads denied."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "w",
        [
            call("payments_charge", {"order_id": "o", "amount": 1}, "c"),
            call("payments_charge", {"order_id": "q", "amount": 3}, "e"),
        ],
        [call("payments_charge", {"order_id": "o", "amount": 1}, "again")],
        [say("not charged")],
    )
    state = result.to_state()
    first, second = result.interruptions
    state.reject(first)
    state.reject(second, rejection_message="card flagged")
    async with ledger.workflow("w"):
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
        assert await ledger.pending_approvals() == []
    assert resumed.final_output == "not charged" and charged == []
    denied = await the_effect(ledger, "w", order_id="o", amount=1)
    assert denied.status is EffectStatus.DENIED and denied.decided_by == RUN_STATE
    flagged = await the_effect(ledger, "w", order_id="q", amount=3)
    assert flagged.status is EffectStatus.DENIED and flagged.error is not None
    assert flagged.error.message == "card flagged"
    assert "A person denied this call" in str(outputs(resumed)["again"])


async def test_sync_decisions_brings_in_decisions_made_on_the_ledger(harness: StoreHarness) -> None:
    """Approved with ledger.approve (the CLI, a dashboard): sync, resume, it runs once."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "w",
        [
            call("payments_charge", {"order_id": "yes", "amount": 1}, "y"),
            call("payments_charge", {"order_id": "no", "amount": 1}, "n"),
        ],
        [say("one charged, one refused")],
    )
    state = result.to_state()
    async with ledger.workflow("w"):
        assert len(await sync_decisions(state)) == 2  # nobody decided yet
        yes = await the_effect(ledger, "w", order_id="yes", amount=1)
        no = await the_effect(ledger, "w", order_id="no", amount=1)
        assert await ledger.approve(yes.idem_key, by="ops")
        assert await ledger.deny(no.idem_key, by="ops", reason="duplicate order")
        assert await sync_decisions(state) == []
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    assert resumed.final_output == "one charged, one refused"
    assert charged == [1]
    assert "duplicate order" in str(outputs(resumed)["n"])


MALFORMED = {
    "bad_json": '{"order_id": "o1", "amount": 5',
    "array": '["o1", 5]',
    "null": "null",
    "empty": "",
    "nan": '{"order_id": "o1", "amount": NaN}',
}


async def test_sync_decisions_answers_a_paused_call_whose_arguments_make_no_call(
    harness: StoreHarness,
) -> None:
    """The SDK pauses (fails closed) on arguments it cannot parse for a tool with a
    policy; no ledger effect can exist for them, so sync_decisions rejects them in the
    run state with what is wrong, and the resumed run tells the model; nothing stored."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "w",
        [call("payments_charge", raw, name) for name, raw in MALFORMED.items()]
        + [call("payments_charge", {"order_id": "ok", "amount": 1}, "fine")],
        [say("fixed")],
    )
    assert sorted(str(i.call_id) for i in result.interruptions) == sorted([*MALFORMED, "fine"])
    state = result.to_state()
    async with ledger.workflow("w"):
        [left] = await sync_decisions(state)  # only the well-formed call waits
        assert left.call_id == "fine"
        assert [e.call_id for e in await ledger.pending_approvals()] == ["fine"]
        again = await sync_decisions(state)  # and asking again changes nothing
        assert [i.call_id for i in again] == ["fine"]
        await ledger.deny((await ledger.pending_approvals())[0].idem_key, by="ops")
        assert await sync_decisions(state) == []
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)

    assert resumed.final_output == "fixed" and charged == []
    got = outputs(resumed)
    assert "not valid JSON" in str(got["bad_json"])
    assert "must be a JSON object" in str(got["array"])
    assert "must be a JSON object" in str(got["null"])
    assert "Field required" in str(got["empty"])
    assert "NaN" in str(got["nan"])
    assert "A person denied this call" in str(got["fine"])
    assert await harness.raw_count() == 1  # the denied one


async def test_approve_or_reject_of_a_call_whose_arguments_make_no_call(
    harness: StoreHarness,
) -> None:
    """approve() lets the invocation tell the model what is wrong; reject() tells it
    too; neither stores anything."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    agent, _, result = await interrupted(
        ledger,
        "w",
        [
            call("payments_charge", MALFORMED["bad_json"], "yes"),
            call("payments_charge", MALFORMED["array"], "no"),
        ],
        [say("fixed")],
    )
    state = result.to_state()
    yes, no = result.interruptions
    async with ledger.workflow("w"):
        assert await approve(state, yes, by="ada") is None
        assert await reject(state, no, by="ada") is None
        assert await sync_decisions(state) == []
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    got = outputs(resumed)
    assert "not valid JSON" in str(got["yes"])
    assert "must be a JSON object" in str(got["no"])
    assert charged == [] and await harness.raw_count() == 0


async def test_five_duplicate_calls_needing_approval_make_one_request(
    harness: StoreHarness,
) -> None:
    """Five ids, one key: one pending effect, approved once, run once, five outputs."""
    ledger, charged = charge_ledger(harness, requires_approval=True)
    ids = [f"c{n}" for n in range(5)]
    agent, _, result = await interrupted(
        ledger,
        "w",
        [call("payments_charge", {"order_id": "o", "amount": 3}, i) for i in ids],
        [say("done")],
    )
    assert sorted(i.call_id or "" for i in result.interruptions) == ids
    assert len(await ledger.pending_approvals()) == 1
    state = result.to_state()
    async with ledger.workflow("w"):
        for item in state.get_interruptions():
            effect = await approve(state, item, by="ada")
            assert effect is not None and effect.status is EffectStatus.READY
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    assert charged == [3]
    got = outputs(resumed)
    assert sorted(got) == ids and len(set(map(str, got.values()))) == 1


async def test_a_positional_only_parameter_is_keyed_like_a_direct_call(
    harness: StoreHarness,
) -> None:
    """``def f(order_id, /)``: the model names it; the approval finds the same effect."""
    ledger = harness.ledger()
    refunded: list[str] = []

    @ledger.tool("payments.refund", requires_approval=True)
    def refund(order_id: str, /, reason: str = "asked") -> str:
        refunded.append(order_id)
        return f"refunded {order_id}"

    agent, _, result = await interrupted(
        ledger,
        "w",
        [call("payments_refund", {"order_id": "o3", "reason": "late"}, "r")],
        [say("ok")],
    )
    state = result.to_state()
    async with ledger.workflow("w"):
        effect = await approve(state, result.interruptions[0], by="ada")
        assert effect is not None and effect.args == {"order_id": "o3", "reason": "late"}
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    assert refunded == ["o3"] and outputs(resumed)["r"] == "refunded o3"


async def test_an_effect_put_back_to_wait_tells_the_model_it_has_not_run(
    harness: StoreHarness,
) -> None:
    """A tool without a policy whose effect waits anyway (created so elsewhere): not run."""
    ledger, charged = charge_ledger(harness, scope="workflow")  # keyed as a direct call
    async with ledger.workflow("w"):
        tool_call = ledger.tools["payments.charge"].tool_call("o", 1)
    park = RunOptions(requires_approval=True, wait_for_approval=False)
    with pytest.raises(ApprovalPendingError):
        await ledger.run(tool_call, lambda _: None, park)
    _, _, result = await interrupted(
        ledger, "w", [call("payments_charge", {"order_id": "o", "amount": 1}, "c")], [say("ok")]
    )
    assert "waiting for a person's approval" in str(outputs(result)["c"])
    assert result.interruptions == [] and charged == []


# -- the extra -------------------------------------------------------------------------------


def test_without_the_sdk_the_import_error_names_the_extra() -> None:
    """A None in sys.modules makes `import agents` fail as if it were not installed."""
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "try:\n"
        "    import agent_ledger.adapters.openai_agents\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install "agent-ledger[agents]"' in out.stdout


def test_importing_agent_ledger_does_not_import_the_sdk() -> None:
    code = "import sys, agent_ledger, agent_ledger.adapters; print('agents' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- ledger outcomes the application must see --------------------------------------------


async def test_a_budget_refusal_is_raised_out_of_runner_run_not_please_try_again(
    harness: StoreHarness,
) -> None:
    """The SDK turns a tool's exception into "please try again" (or UserError): a budget
    refusal reaches the application as BudgetExceededError itself, nothing ran; with
    tell_model=True the model reads that the budget refused it, instead."""
    ledger, charged = charge_ledger(harness)
    model = ScriptedModel(
        [call("payments_charge", {"order_id": "o1", "amount": 1}, "a")],
        [call("payments_charge", {"order_id": "o2", "amount": 2}, "b")],
        [say("unreachable")],
    )
    agent = Agent(name="a", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow("capped", budget=Budget(tool_calls=1)):
        with pytest.raises(BudgetExceededError) as caught:
            await Runner.run(agent, "go", run_config=NO_TRACING)
    assert caught.value.workflow_id == "capped" and "tool_calls" in caught.value.units
    assert charged == [1]

    told = ScriptedModel(
        [call("payments_charge", {"order_id": "o3", "amount": 3}, "c")], [say("out of budget")]
    )
    agent = Agent(name="a", model=told, tools=as_function_tools(ledger, tell_model=True))
    async with ledger.workflow("capped"):
        result = await Runner.run(agent, "go", run_config=NO_TRACING)
    assert result.final_output == "out of budget" and charged == [1]
    assert "refused before it ran: workflow 'capped' has no budget" in str(outputs(result)["c"])


async def test_a_replay_that_diverges_is_raised_out_of_runner_run(
    harness: StoreHarness,
) -> None:
    """Replaying a recorded run whose model now asks for a call the recording lacks:
    UnrecordedEffectError out of Runner.run, not a "please try again" the run shrugs off."""
    ledger, charged = charge_ledger(harness)
    model = ScriptedModel(
        [call("payments_charge", {"order_id": "o1", "amount": 1}, "a")], [say("done")]
    )
    agent = Agent(name="a", model=model, tools=as_function_tools(ledger))
    async with ledger.workflow("recorded"):
        await Runner.run(agent, "go", run_config=NO_TRACING)
    assert charged == [1]

    replayer = build_ledger(MemoryStore())  # a replay reads one store, keeps to another
    replayed: list[str] = []

    @replayer.tool("payments.charge", idempotency_keys=["order_id"])
    async def charge(order_id: str, amount: int) -> dict[str, object]:
        """Charge an order."""
        replayed.append(order_id)
        return {}

    same = ScriptedModel(
        [call("payments_charge", {"order_id": "o1", "amount": 1}, "a")], [say("done")]
    )
    other = ScriptedModel(
        [call("payments_charge", {"order_id": "o2", "amount": 1}, "a")], [say("done")]
    )
    async with replayer.replay("recorded", source=ledger.store):
        again = await Runner.run(
            Agent(name="a", model=same, tools=as_function_tools(replayer)),
            "go",
            run_config=NO_TRACING,
        )
        assert outputs(again) == {"a": outputs(again)["a"]} and "o1" in str(outputs(again)["a"])
        with pytest.raises(UnrecordedEffectError):
            await Runner.run(
                Agent(name="a", model=other, tools=as_function_tools(replayer)),
                "go",
                run_config=NO_TRACING,
            )
    assert replayed == []
