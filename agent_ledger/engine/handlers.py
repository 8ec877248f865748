"""Calling a handler, and what to record for the exception it raised.

:func:`call_handler` is the one place the engine calls a handler, for its
first try and every retry alike: on the event loop (an ``async def``, or a
plain function with ``sync_handlers="loop"``) or in a worker thread of the
engine's own pool, and under its ``timeout_ms`` if it has one (see
``deadline``). The rest turns a handler's exception into the
``EffectError`` its effect records.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from inspect import CO_COROUTINE
from types import CoroutineType, FunctionType
from typing import Final

from agent_ledger.effects import Effect, EffectError, FailedWithUsage, Usage, usage_to_json
from agent_ledger.engine.deadline import within
from agent_ledger.engine.limits import cap_code, cap_message
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.options import ResolvedRunOptions

__all__ = [
    "HANDLER_THREADS",
    "call_handler",
    "called_inline",
    "error_of",
    "failure_of",
    "type_name",
    "usage_json",
]

#: Where plain (sync) handlers run: a pool of the engine's own rather than the
#: event loop's default executor (a handful of threads), so a sync tool that
#: blocks on another tool's ``.sync()`` (which needs a thread for its own
#: handler) does not starve the pool with a few such calls at once.
HANDLER_THREADS: Final = 64
_handler_pool: ThreadPoolExecutor | None = None
_handler_pool_lock = threading.Lock()


def called_inline(handler: Callable[[Effect], object], opts: ResolvedRunOptions) -> bool:
    """Whether :func:`call_handler` would just call ``handler`` and await what it
    returns (an ``async def``, no deadline): ``execute`` then does that itself,
    without the coroutine frame of ``call_handler``. Calling it only makes the
    coroutine, so what its body raises is raised exactly as before; a plain
    function stays in ``call_handler`` (a ``StopIteration`` it raises becomes
    a ``RuntimeError`` at that frame's edge)."""
    return opts.timeout_ms is None and _is_async(handler)


async def call_handler(
    handler: Callable[[Effect], object], effect: Effect, opts: ResolvedRunOptions
) -> object:
    """One call of the handler; its value, or a ``Late`` when it ran past its
    ``timeout_ms`` (``deadline.within``). Raises what the handler raised."""
    if opts.timeout_ms is not None:
        return await within(opts.timeout_ms, functools.partial(_start, handler, effect, opts))
    # _start, inline (one coroutine frame less per run).
    if opts.sync_in_thread and not _is_async(handler):
        value = await _in_handler_thread(handler, effect)
    else:
        value = handler(effect)
    if type(value) is CoroutineType or inspect.isawaitable(value):
        value = await value
    return value


async def _start(
    handler: Callable[[Effect], object], effect: Effect, opts: ResolvedRunOptions
) -> object:
    """Call the handler, without awaiting what it returns (``deadline.within``
    awaits that until the deadline).

    A plain function may block (a requests call, ``time.sleep``): in a worker
    thread it cannot stall the loop, and with it the heartbeats.
    """
    if opts.sync_in_thread and not _is_async(handler):
        return await _in_handler_thread(handler, effect)
    return handler(effect)


def _is_async(handler: Callable[[Effect], object]) -> bool:
    """``inspect.iscoroutinefunction(handler)``, with an ``async def`` function's
    answer read from its code flags first (the common handler: no unwrapping)."""
    if type(handler) is FunctionType and handler.__code__.co_flags & CO_COROUTINE:
        return True
    return inspect.iscoroutinefunction(handler)


def _handler_threads() -> ThreadPoolExecutor:
    global _handler_pool
    if _handler_pool is None:
        with _handler_pool_lock:
            if _handler_pool is None:
                _handler_pool = ThreadPoolExecutor(
                    max_workers=HANDLER_THREADS, thread_name_prefix="agent-ledger-handler"
                )
    return _handler_pool


async def _in_handler_thread(handler: Callable[[Effect], object], effect: Effect) -> object:
    """``asyncio.to_thread`` on the handler pool: the caller's context goes along."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _handler_threads(), functools.partial(context.run, _call_in_thread, handler, effect)
    )


def _call_in_thread(handler: Callable[[Effect], object], effect: Effect) -> object:
    try:
        return handler(effect)
    except StopIteration as exc:
        # A StopIteration cannot cross into an asyncio future (the await would
        # hang); like PEP 479 does for coroutines, make it a RuntimeError.
        raise RuntimeError(f"handler raised StopIteration: {exc!r}") from exc


# -- what a failure records ----------------------------------------------------------


def usage_json(usage: object) -> str:
    """``usage`` as the text its column keeps, or ``EffectLedgerValidationError``
    (field ``usage``) when it is not a ``Usage`` or cannot be encoded."""
    if not isinstance(usage, Usage):
        raise EffectLedgerValidationError(
            f"the handler's usage must be a Usage, got {type(usage).__name__}", field="usage"
        )
    try:
        text = usage_to_json(usage)
    except Exception as exc:
        raise EffectLedgerValidationError(
            f"the handler's usage could not be stored: {exc}", field="usage"
        ) from exc
    assert text is not None
    return text


def failure_of(exc: Exception) -> tuple[EffectError, str | None, Exception]:
    """What to record for a handler's exception (the error, and the usage a
    ``FailedWithUsage`` carries), and what to raise once it is recorded."""
    if type(exc) is not FailedWithUsage:
        return error_of(exc), None, exc
    try:
        usage: str | None = usage_json(exc.usage)
    except EffectLedgerValidationError:
        usage = None
    return error_of(exc.cause), usage, exc.cause


def error_of(exc: BaseException) -> EffectError:
    """The ``EffectError`` to record for a handler's exception, whatever it does.

    A broken ``__str__`` or ``code`` must not stop the failure from being
    recorded: the effect would stay processing and be run again.
    """
    try:
        message = str(exc) or type(exc).__name__
    except Exception:
        message = f"{type(exc).__name__} (its message could not be read)"
    try:
        code = _error_code(exc)
    except Exception:
        code = type(exc).__name__
    # Cut to the limits every store holds (engine.limits): an outcome the store
    # refused would leave the effect processing, to be run again.
    return EffectError(message=cap_message(message), code=cap_code(code))


def type_name(exc: BaseException) -> str:
    """The exception's class, qualified by its module unless it is a builtin."""
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _error_code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if code is None or isinstance(code, bool):
        return type(exc).__name__
    return code if isinstance(code, str) else str(code)
