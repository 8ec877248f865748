"""An event loop on a thread of its own, for callers that are not async.

Most agent loops are synchronous, and the ledger is async. A sync caller
hands its coroutine to a loop running on a daemon thread and blocks until
it is done. The coroutine runs in a copy of the caller's context, so
context variables (the ``ledger.workflow()`` scope) reach it.

The cost is a thread hop per call (two context switches: tens of
microseconds), which disappears beside any real tool.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["BackgroundLoop", "run_blocking"]

T = TypeVar("T")


class BackgroundLoop:
    """An asyncio event loop serving one daemon thread until ``stop()``.

    Stopping cancels what is still running there (each task handles the
    cancellation as it would anywhere: a ledger run records its effect
    ``canceled``), shuts down async generators and the default executor,
    and closes the loop. An interpreter that exits without ``stop()`` stops
    it at exit.
    """

    def __init__(self, name: str = "agent-ledger-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        #: The callers' tasks still running (touched on the loop's thread only).
        self._calls: set[asyncio.Task[Any]] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()
        stop = weakref.WeakMethod(self.stop)
        self._at_exit = lambda: (s := stop()) is not None and s()
        atexit.register(self._at_exit)

    @property
    def running(self) -> bool:
        """True until ``stop()`` was called (or the thread ended)."""
        return not self._stopped and self._thread.is_alive()

    def _serve(self, started: threading.Event) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def run(self, awaitable: Awaitable[T], context: contextvars.Context | None = None) -> T:
        """Run ``awaitable`` on this loop from another thread and return its result."""
        if not self.running:
            _close(awaitable)
            raise RuntimeError("this background loop was stopped; it runs nothing more")
        return run_blocking(self.loop, awaitable, context, self._track)

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def drain(self) -> None:
        """Cancel the callers' calls still running here and wait until each has ended.

        Each ends as a cancelled task ends (a ledger run records its effect
        ``canceled``), while the resources it needs are still open. Tasks the
        loop runs for itself (a connection pool's workers) are left alone.
        """
        if self.running:
            self.run(self._cancel_calls())

    async def _cancel_calls(self) -> None:
        me = asyncio.current_task()
        calls = [t for t in self._calls if t is not me]
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Stop the loop and wait (up to ``timeout_s``) for its thread to end. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self._at_exit)
        if threading.current_thread() is self._thread:
            raise RuntimeError("a background loop cannot be stopped from its own thread")
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            return
        self._thread.join(timeout_s)


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _close(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run, so Python does not warn it was never awaited."""
    if isinstance(awaitable, Coroutine):
        awaitable.close()


def run_blocking(
    loop: asyncio.AbstractEventLoop,
    awaitable: Awaitable[T],
    context: contextvars.Context | None = None,
    on_start: Callable[[asyncio.Task[T]], None] | None = None,
) -> T:
    """Run ``awaitable`` as a task on ``loop`` (running in another thread) and wait for it.

    The task runs in ``context`` (default: a copy of the caller's). If the
    waiting thread is interrupted (``KeyboardInterrupt``), the task is
    cancelled and waited for, so it ends the way a cancelled task ends,
    before the interrupt propagates.
    """
    ctx = context if context is not None else contextvars.copy_context()
    coro = awaitable if isinstance(awaitable, Coroutine) else _await(awaitable)
    done = threading.Event()
    box: list[asyncio.Task[T]] = []

    def start() -> None:
        task = loop.create_task(coro, context=ctx)
        task.add_done_callback(lambda _: done.set())
        box.append(task)
        if on_start is not None:
            on_start(task)

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:
        coro.close()
        raise
    try:
        done.wait()
    except BaseException:
        loop.call_soon_threadsafe(lambda: box[0].cancel())
        done.wait()
        raise
    return box[0].result()
