"""What a model reads when the ledger, not the tool, answers its call.

A framework that hands errors back to the model (an MCP error result, a
tool message with an error status) should say what happened in the model's
terms: did anything run, will calling again help, with which arguments.
Each text names the effect by its key's first 12 characters, as the CLI
and the errors do, so a person reading the transcript can find the receipt.
"""

from __future__ import annotations

from agent_ledger.adapters._common import MalformedToolCall
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectFailedError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
)
from agent_ledger.status import EffectStatus

__all__ = ["for_model", "raised_as"]


def for_model(error: BaseException) -> str | None:
    """The text for a model, for the ledger outcomes a model should read; None otherwise.

    Covered: a malformed call (nothing stored), a call waiting for approval
    (``ApprovalPendingError``), a denied or canceled one, a payload mismatch,
    and a wait for another caller that timed out. Anything else (the tool's
    own exception, a store failure, a programming error) is not the model's
    to read: None.
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
        what = (
            "A person denied this call"
            if error.status is EffectStatus.DENIED
            else "This call was canceled"
        )
        because = f" ({error.reason})" if error.reason else ""
        return (
            f"{what}{because} (effect {_ref(error.effect.idem_key)}). It did not run and will "
            "not run: calling again with the same arguments gives this answer."
        )
    if isinstance(error, EffectPayloadMismatchError):
        return (
            f"This call has the same key as an earlier call (effect {_ref(error.effect.idem_key)}) "
            f"but different values of {list(error.fields)}. The earlier call stands and nothing "
            "ran. Repeat the earlier values to get its result; a different request needs "
            "different key arguments."
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


def _ref(idem_key: str) -> str:
    return f"{idem_key[:12]}…"


def raised_as(error: EffectFailedError, base: type[BaseException]) -> bool:
    """Whether the replayed failure was first raised as ``base`` (or a subclass of it).

    Frameworks have an exception for "an error the model should read"
    (LangChain's ``ToolException``, MCP's ``ToolError``) and treat it apart
    from a crash. A replay raises ``EffectFailedError`` instead; this tells
    an adapter to raise the framework's class again, so the model reads the
    same on a replay as on the first call. The ledger records an exception's
    class name as the error code (unless it carries a ``code`` of its own),
    so the name is matched against ``base`` and its subclasses.
    """
    code = error.code
    if code is None:
        return False
    classes: list[type[BaseException]] = [base]
    while classes:
        cls = classes.pop()
        if cls.__name__ == code:
            return True
        classes.extend(cls.__subclasses__())
    return False
