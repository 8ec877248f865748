"""What a model reads when the ledger, not the tool, answers its call.

A framework that hands errors back to the model (an MCP error result, a
tool message with an error status) should say what happened in the model's
terms: did anything run, will calling again help, with which arguments.
Each text names the effect by its key's first 12 characters, as the CLI
and the errors do, so a person reading the transcript can find the receipt.
"""

from __future__ import annotations

from collections.abc import Callable

from agent_ledger.adapters._common import MalformedToolCall
from agent_ledger.codes import ErrorCode
from agent_ledger.effects import TryFailure
from agent_ledger.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    EffectDeniedError,
    EffectFailedError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
    HandlerTimeoutError,
)
from agent_ledger.status import EffectStatus
from agent_ledger.tools import CallOutcome

__all__ = [
    "answer_failure",
    "budget_text",
    "earlier_run_text",
    "earlier_turn_text",
    "failure_text",
    "first_raised",
    "for_model",
    "may_have_run",
    "outcome_text",
    "raised_as",
    "retryable_text",
]


def for_model(error: BaseException) -> str | None:
    """The text for a model, for the ledger outcomes a model should read; None otherwise.

    Covered: a malformed call (nothing stored), a call waiting for approval
    (``ApprovalPendingError``), a denied or canceled one (one canceled after
    its handler started may have taken effect: the text says so), a payload mismatch,
    a handler that ran past its deadline, and a wait for another caller that
    timed out. Anything else (the tool's own exception, a store failure, a
    programming error) is not the model's to read: None.
    """
    if isinstance(error, MalformedToolCall):
        return str(error)
    if isinstance(error, ApprovalPendingError):
        return (
            f"This call needs a person's approval and is waiting for it (effect "
            f"{_ref(error.idem_key)}), so it has not run. Call the tool again later with the "
            "same arguments: it then runs once if approved, or answers that it was denied."
        )
    if isinstance(error, EffectDeniedError):
        because = f" ({error.reason})" if error.reason else ""
        ref = _ref(error.effect.idem_key)
        if error.status is EffectStatus.CANCELED and may_have_run(error):
            # Cut off while a handler ran (ErrorCode.RUN_CANCELLED), or a
            # person's cancel() (ErrorCode.CANCELED) of an effect a handler
            # had started: nobody knows whether the side effect happened.
            who = (
                "This call was stopped while it was running"
                if _code(error) == ErrorCode.RUN_CANCELLED
                else f"A person canceled this call after it had started{because}"
            )
            return (
                f"{who} (effect {ref}). It may or may not have taken effect, and it will not "
                "run again: calling again with the same arguments gives this answer. Find out "
                "whether it took effect before doing anything that depends on it."
            )
        what = (
            "A person denied this call"
            if error.status is EffectStatus.DENIED
            else "This call was canceled"
        )
        return (
            f"{what}{because} (effect {ref}). It did not run and will not run: calling "
            "again with the same arguments gives this answer."
        )
    if isinstance(error, EffectPayloadMismatchError):
        return (
            f"This call has the same key as an earlier call (effect {_ref(error.effect.idem_key)}) "
            f"but different values of {list(error.fields)}. The earlier call stands and nothing "
            "ran. Repeat the earlier values to get its result; a different request needs "
            "different key arguments."
        )
    if isinstance(error, HandlerTimeoutError):
        # Before its base class: the handler, not a wait, ran out of time.
        how = (
            "was stopped at its time limit"
            if error.status is EffectStatus.CANCELED
            else "finished only after its time limit"
        )
        return (
            f"This call {how} ({error.limit_ms} ms; effect {_ref(error.idem_key)}). It may "
            "or may not have taken effect, and it will not run again: calling again with the "
            "same arguments gives this answer. Find out whether it took effect before doing "
            "anything that depends on it."
        )
    if isinstance(error, EffectTimeoutError):
        doing = (
            "waiting for a person's approval"
            if error.status is EffectStatus.REQUIRES_APPROVAL
            else "still being run by an earlier call"
        )
        return (
            f"This call is {doing} (effect {_ref(error.idem_key)}); nothing new ran. Call the "
            "tool again later with the same arguments to get its result."
        )
    return None


def _code(error: EffectDeniedError) -> str | None:
    return error.effect.error.code if error.effect.error is not None else None


def may_have_run(error: EffectDeniedError) -> bool:
    """Whether a canceled effect's handler may have run: the engine recorded a
    cancellation mid-run, or a handler had been started before a person canceled it."""
    return _code(error) == ErrorCode.RUN_CANCELLED or error.effect.executions > 0


def _ref(idem_key: str) -> str:
    return f"{idem_key[:12]}…"


def first_raised(error: EffectFailedError) -> tuple[str | None, str]:
    """The error code and message of the exception the first call raised, for a replay.

    Usually the recorded error's. A tool with a retry policy whose tries ran
    out is recorded ``retries_exhausted`` with a message naming the last
    error, but the first call raised that last try's exception: its code
    and message are the last ``TryFailure`` in the effect's history.
    """
    if error.code == ErrorCode.RETRIES_EXHAUSTED:
        last = next((e for e in reversed(error.effect.history) if isinstance(e, TryFailure)), None)
        if last is not None:
            return last.code, last.message
    return error.code, error.message


def raised_as(error: EffectFailedError, base: type[BaseException]) -> bool:
    """Whether the replayed failure was first raised as ``base`` (or a subclass of it).

    Frameworks have an exception for "an error the model should read"
    (LangChain's ``ToolException``, MCP's ``ToolError``) and treat it apart
    from a crash. A replay raises ``EffectFailedError`` instead; this tells
    an adapter to raise the framework's class again (with ``first_raised``'s
    message), so the model reads the same on a replay as on the first call.
    The ledger records an exception's ``code`` attribute as the error code,
    or its class name when it has none, so the recorded code is matched
    against the name and the class-level ``code`` (a string) of ``base`` and
    each of its subclasses. A ``code`` set on an instance only cannot be
    told from another exception's: such a failure does not match. For a
    tool whose retries ran out, the last try's exception is the one matched
    (see ``first_raised``).
    """
    code, _ = first_raised(error)
    if code is None:
        return False
    classes: list[type[BaseException]] = [base]
    while classes:
        cls = classes.pop()
        if cls.__name__ == code or _class_code(cls) == code:
            return True
        classes.extend(cls.__subclasses__())
    return False


def answer_failure(
    failure: EffectFailedError | None,
    error: Exception,
    base: type[Exception],
    make: Callable[[str], Exception],
) -> Exception:
    """What to raise for a call that failed, so the first call and every replay read alike.

    ``failure`` is the effect's recorded failure (as a replay raises it),
    ``error`` what the run raised (on a replay, ``failure`` itself). Both
    are answered from the record: as the framework's "error for the model"
    (``make(message)``, a ``base``) when ``raised_as`` says the failure was
    one, else as the exception raised, which the framework treats as a
    crash. A ``base`` whose recorded code a replay cannot recognise (its
    ``code`` set on the instance) is answered as a crash from the first call
    on: ``failure``, not ``error``. With no record, ``error`` as it is.
    """
    if failure is None:
        return error
    if raised_as(failure, base):
        return make(first_raised(failure)[1])
    return failure if isinstance(error, base) else error


def _class_code(cls: type[BaseException]) -> str | None:
    """The ``code`` a class declares for its exceptions (a string class attribute), if any."""
    try:
        code = getattr(cls, "code", None)
    except Exception:
        return None
    return code if isinstance(code, str) else None


def budget_text(error: BudgetExceededError) -> str:
    """What a model reads for a call its workflow's budget refused: nothing ran, and why.

    For an adapter whose application chose to tell the model (the MCP
    server's client is one: it has no other way to learn it).
    """
    which = ", ".join(error.units) if error.units else "its limits"
    return (
        f"This call was refused before it ran: workflow {error.workflow_id!r} has no budget "
        f"left for it ({which}). Nothing ran, and calling again will be refused the same way "
        "until a person raises the budget."
    )


def failure_text(error: EffectFailedError, *, show_message: bool = True) -> str:
    """What a model reads for a call recorded as failed, on the first call and every replay.

    Says that it failed, the error code, the receipt, and that calling
    again with the same arguments gives the same answer (a recorded failure
    is final). ``show_message=False`` leaves the exception's own text out
    (an MCP server keeps a crash's text private).
    """
    code, message = first_raised(error)
    detail = f": {message}" if show_message and message else ""
    return (
        f"This call failed ({code or 'error'}{detail}; effect {_ref(error.effect.idem_key)}). "
        "The failure is recorded, and calling again with the same arguments gives this "
        "answer without running it."
    )


# -- answered from an earlier turn, and failures the model may retry ----------------


def earlier_turn_text(outcome: CallOutcome[object], result_text: str) -> str:
    """What a model reads for a call answered from an earlier turn's receipt:
    that it already happened, when, and under which receipt, then its result.

    ``result_text`` is the result as the adapter shows results (its own
    serialization). For the text of any outcome, use :func:`outcome_text`.
    """
    when = (
        f" at {outcome.completed_at:%Y-%m-%d %H:%M} UTC" if outcome.completed_at is not None else ""
    )
    return (
        f"Already done{when}, in an earlier turn (receipt {_ref(outcome.idem_key)}); it was "
        f"not done again. Its result then: {result_text}"
    )


def earlier_run_text(outcome: CallOutcome[object], result_text: str) -> str:
    """What a model reads for a call answered from the receipt of a call an earlier
    run made (an earlier ``Runner.run``, say), in what the ledger takes for the
    same turn: that it already happened, when, under which receipt, and its result.

    For a framework whose run input may lack the conversation (a server-kept
    history, a crashed run retried): a new request that repeats an old one
    cannot always be told from a retry, so the model is told the truth, never
    that it has just happened.
    """
    when = (
        f" at {outcome.completed_at:%Y-%m-%d %H:%M} UTC" if outcome.completed_at is not None else ""
    )
    return (
        f"Already done{when}, in an earlier run (receipt {_ref(outcome.idem_key)}); it was "
        "not done again now. If the user is asking for it again, tell them it was already "
        f"done then. Its result then: {result_text}"
    )


def retryable_text(error: BaseException, idem_key: str) -> str:
    """What a model reads for a failure the tool declared retryable: what failed,
    and that calling again (with the same arguments, or corrected ones) runs it again."""
    message = error.message if isinstance(error, EffectFailedError) else str(error)
    return (
        f"This call failed and may be retried (effect {_ref(idem_key)}): {message}. Calling "
        "the tool again with the same arguments runs it again; different arguments are a "
        "new call."
    )


def outcome_text(outcome: CallOutcome[object], result_text: str) -> str | None:
    """The one text every adapter gives a model for a :class:`CallOutcome`.

    * succeeded in this turn (run now, or a repeat of this turn's call):
      ``result_text`` itself, so every repeat reads alike;
    * answered from an earlier turn's receipt: :func:`earlier_turn_text`,
      never as if it had just happened;
    * a retryable failure (the one just raised, or a replay of one):
      :func:`retryable_text`;
    * any other failure: :func:`for_model`'s text for it, or None when it is
      not the model's to read (the adapter raises it, as it does today).
    """
    error = outcome.error
    if error is None:
        return earlier_turn_text(outcome, result_text) if outcome.from_earlier_turn else result_text
    if outcome.retryable:
        return retryable_text(error, outcome.idem_key)
    return for_model(error)
