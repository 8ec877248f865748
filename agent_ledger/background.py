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
import contextlib
import contextvars
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Generic, TypeVar

__all__ = ["BackgroundLoop", "LoopClosing", "run_blocking"]

T = TypeVar("T")

#: How long interpreter exit waits for the calls it cancels to end, and for the thread.
AT_EXIT_DRAIN_S: Final = 10.0


class LoopClosing(RuntimeError):
    """The background loop is stopping (or stopped) and takes no more calls."""


class BackgroundLoop:
    """An asyncio event loop serving one daemon thread until ``stop()``.

    ``drain()`` cancels the calls still running (each handles the
    cancellation as it would anywhere: a ledger run records its effect
    ``canceled``) and refuses new ones; ``stop()`` ends the thread, shutting
    down async generators and the default executor, and closes the loop.
    An interpreter that exits without them drains and stops the loop at
    exit, before other threads are joined and before the thread pools that
    stores use shut down, so calls still running then are recorded.
    """

    def __init__(self, name: str = "agent-ledger-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        #: False once draining or stopping began; read and set under ``_lock``,
        #: so no call slips in after ``drain()`` has looked at what runs.
        self._accepting = True
        self._lock = threading.Lock()
        #: The callers' tasks still running (touched on the loop's thread only).
        self._calls: set[asyncio.Task[Any]] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()
        myself = weakref.ref(self)

        def at_exit() -> None:
            loop = myself()
            if loop is not None:
                # Bounded: a call that ignores its cancellation must not hold
                # the interpreter's exit for ever.
                with contextlib.suppress(Exception):
                    loop.drain(timeout_s=AT_EXIT_DRAIN_S)
                loop.stop(timeout_s=AT_EXIT_DRAIN_S)

        self._at_exit = at_exit
        register = getattr(threading, "_register_atexit", None)
        try:
            # threading's exit hooks run before non-daemon threads are joined,
            # newest first: so before concurrent.futures shuts its pools (a
            # SqliteStore's thread), which registered when it was imported.
            register(at_exit) if register is not None else atexit.register(at_exit)
        except RuntimeError:  # the interpreter is already shutting down
            atexit.register(at_exit)

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
        """Run ``awaitable`` on this loop from another thread and return its result.

        Raises ``LoopClosing`` once ``drain()`` or ``stop()`` began.
        """
        with self._lock:
            if not self._accepting or not self.running:
                _close(awaitable)
                raise LoopClosing("this background loop is stopping; it takes no more calls")
            waiting = _submit(self.loop, awaitable, context, self._track)
        return waiting.result()

    def run_closing(self, awaitable: Awaitable[T]) -> T:
        """``run`` for the owner's last words after ``drain()`` (closing what the calls
        used), which ``run`` would refuse."""
        with self._lock:
            if not self.running:
                _close(awaitable)
                raise LoopClosing("this background loop was stopped")
            waiting = _submit(self.loop, awaitable, None, None)
        return waiting.result()

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def drain(self, timeout_s: float | None = None) -> None:
        """Refuse new calls, cancel the callers' calls still running here, and wait until
        each has ended. Idempotent.

        Each ends as a cancelled task ends (a ledger run records its effect
        ``canceled``), while the resources it needs are still open. Tasks the
        loop runs for itself (a connection pool's workers) are left alone.
        Every call submitted before this one is tracked by the time the
        cancelling runs (the loop runs callbacks in order).
        """
        with self._lock:
            self._accepting = False
            if not self.running:
                return
            waiting = _submit(self.loop, self._cancel_calls(), None, None)
        waiting.result(timeout_s)

    async def _cancel_calls(self) -> None:
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Stop the loop and wait (up to ``timeout_s``) for its thread to end. Idempotent."""
        with self._lock:
            self._accepting = False
            if self._stopped:
                return
            self._stopped = True
        with contextlib.suppress(ValueError):
            atexit.unregister(self._at_exit)
        if threading.current_thread() is self._thread:
            raise RuntimeError("a background loop cannot be stopped from its own thread")
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            return
        self._thread.join(timeout_s)


def _close(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run, so Python does not warn it was never awaited."""
    if isinstance(awaitable, Coroutine):
        awaitable.close()


def run_blocking(
    loop: asyncio.AbstractEventLoop,
    awaitable: Awaitable[T],
    context: contextvars.Context | None = None,
    on_start: Callable[[asyncio.Task[Any]], None] | None = None,
) -> T:
    """Run ``awaitable`` as a task on ``loop`` (running in another thread) and wait for it.

    The task runs in ``context`` (default: a copy of the caller's). If the
    waiting thread is interrupted (``KeyboardInterrupt``), the task is
    cancelled and waited for, so it ends the way a cancelled task ends,
    before the interrupt propagates. A ``SystemExit`` or ``KeyboardInterrupt``
    the call raises reaches this caller, and leaves the loop running.
    """
    return _submit(loop, awaitable, context, on_start).result()


class _Submitted(Generic[T]):
    """A call scheduled on a loop in another thread; ``result()`` waits for it."""

    __slots__ = ("_box", "_done", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._done = threading.Event()
        self._box: list[asyncio.Task[T | _Escaped]] = []

    def result(self, timeout_s: float | None = None) -> T:
        """The call's result; ``TimeoutError`` if it is not done within ``timeout_s``."""
        loop, box = self._loop, self._box
        try:
            _wait(self._done, loop, timeout_s)
        except BaseException:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to cancel
                loop.call_soon_threadsafe(lambda: box[0].cancel() if box else None)
            with contextlib.suppress(RuntimeError, TimeoutError):
                _wait(self._done, loop, timeout_s)
            raise
        result = box[0].result()
        if isinstance(result, _Escaped):
            raise result.exc
        return result


def _submit(
    loop: asyncio.AbstractEventLoop,
    awaitable: Awaitable[T],
    context: contextvars.Context | None,
    on_start: Callable[[asyncio.Task[Any]], None] | None,
) -> _Submitted[T]:
    ctx = context if context is not None else contextvars.copy_context()
    submitted: _Submitted[T] = _Submitted(loop)
    coro = _guarded(awaitable)

    def start() -> None:
        task = loop.create_task(coro, context=ctx)
        task.add_done_callback(lambda _: submitted._done.set())
        submitted._box.append(task)
        if on_start is not None:
            on_start(task)

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:
        coro.close()
        _close(awaitable)
        raise
    return submitted


def _wait(
    done: threading.Event, loop: asyncio.AbstractEventLoop, timeout_s: float | None = None
) -> None:
    """Wait for ``done``; raise if the loop stops (or closes) before setting it, which
    would otherwise leave the caller waiting for ever, or when ``timeout_s`` passed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not done.wait(0.25):
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"the call did not finish within {timeout_s} s")
        if loop.is_closed() or not loop.is_running():
            if done.is_set():
                return
            raise RuntimeError(
                "the event loop running this call stopped before the call finished; its "
                "effect, if it started, is left to its lease (the next caller takes it over)"
            )


class _Escaped:
    """A ``SystemExit``/``KeyboardInterrupt`` a call raised, carried out of the loop.

    asyncio lets those two escape ``run_forever()``, which would kill the loop
    (and every other call on it) and leave this call's caller waiting. The
    call's own caller gets it instead.
    """

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _guarded(awaitable: Awaitable[T]) -> T | _Escaped:
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:
        return _Escaped(exc)
