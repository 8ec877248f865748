"""Carrying work to its end through a cancellation of the task that waits for it.

Some work must not be cut short when its caller gives up: recording a
handler's outcome (the side effect has happened), giving back an effect a
cancelled run owns, settling a budget's hold, rolling a saga back. Were it
awaited directly, a cancellation would stop it half way; wrapped in
``asyncio.shield`` once, a second cancellation would still end the wait and
leave the work running with nobody to read its outcome.

So the work runs in a task of its own, and the caller waits for it through
any number of cancellations (:func:`until_done`), then raises the
cancellation once the work has ended (:func:`carry_through`). Only a
cancellation of the work's own task (the event loop closing) ends the wait
early. This is the one place that loop is written: the engine, tools and
sagas all use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["carry_through", "until_done"]

T = TypeVar("T")


async def until_done(future: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait for ``future`` to end, through any number of cancellations of this task.

    Returns the last cancellation of this task that arrived meanwhile (None
    if none did), for the caller to raise once it has read the outcome. The
    future's own error is not raised here: read it from the future. If the
    future itself is cancelled (the event loop is closing, or its owner
    cancelled it), the wait ends there: check ``future.cancelled()``.
    """
    interrupted: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            if not future.cancelled():
                interrupted = exc
        except Exception:
            pass  # the future's own error: the caller reads it from the future
    return interrupted


async def carry_through(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if this task is cancelled meanwhile; then
    raise that cancellation, if one came, else return the work's result.

    The work's own error is raised in either case (as an ``asyncio.TaskGroup``
    raises its tasks' errors over its caller's cancellation): it says more
    than the cancellation, which the caller asked for and knows of. Work that
    must not raise catches and logs its own errors.
    """
    task = asyncio.ensure_future(work)
    interrupted = await until_done(task)
    result = task.result()  # its error, or a cancellation of the task itself
    if interrupted is not None:
        raise interrupted
    return result
