"""An event loop on a thread of its own, for callers that are not async.

Most agent loops are synchronous, and the ledger is async. A sync caller
hands its coroutine to a loop running on a daemon thread and blocks until
it is done. The coroutine runs in a copy of the caller's context, so
context variables (the ``ledger.workflow()`` scope) reach it.

The cost is a thread hop per call (two context switches: tens of
microseconds), which disappears beside any real tool.

:class:`HomeLoop` is the part a ledger owns: which loop its calls run on,
and the background loop it starts for sync callers and stops with
``close_sync()``.
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
from typing import Any, Final, Generic, ParamSpec, TypeVar

from agent_ledger.errors import EffectLedgerValidationError

__all__ = ["BackgroundLoop", "HomeLoop", "LoopClosing", "run_blocking"]

T = TypeVar("T")
P = ParamSpec("P")

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


class HomeLoop:
    """The event loop an async object (a ledger) lives on, and the one it owns for sync callers.

    Async callers tell it the loop each call runs on (:meth:`enter`): a
    store's connections and its waiters' notifications belong to the loop
    that made them. Sync callers (:meth:`call`) run on that loop when async
    code drives the object from another thread, else on a background loop
    started by the first such call and owned until :meth:`close`. While the
    background loop runs, no other loop may use the object.
    """

    def __init__(self) -> None:
        #: The loop the object last ran on (None: not yet, or closed).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._background: BackgroundLoop | None = None
        #: Whether closing also closes the store (it was opened on the background loop).
        self._owns_store = False
        self._lock = threading.Lock()
        self._closing = False
        self._store_closed = False

    def enter(self, loop: asyncio.AbstractEventLoop) -> None:
        """Note the loop a call starts on; refuse a second loop beside the background one.

        An object driven from sync code keeps its store on its background
        loop (a PostgreSQL pool, the waiters' notifications belong to the
        loop that made them), so async code on another loop must not use it
        meanwhile.
        """
        background = self._background
        if background is not None and background.running and loop is not background.loop:
            raise EffectLedgerValidationError(
                "this ledger is being driven from sync code (tool.sync(), run_sync()), so "
                "its store lives on the ledger's background event loop; it cannot also run "
                "on another event loop. Use one ledger per side, or call close_sync() first.",
                field="loop",
            )
        self.loop = loop

    def call(
        self, what: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(*args, **kwargs)`` for a sync caller and block until it is done.

        It runs in a copy of the caller's context; ``what`` names the call
        in the error a caller on a running event loop gets instead of
        stalling that loop.
        """
        loop = self._blocking_loop(what)
        context = contextvars.copy_context()
        background = self._background
        if background is not None and loop is background.loop:
            try:
                return background.run(fn(*args, **kwargs), context)
            except LoopClosing:
                raise EffectLedgerValidationError(
                    "this ledger is being closed (close_sync(), or the interpreter is "
                    "exiting); the call was not started",
                    field="ledger",
                ) from None
        return run_blocking(loop, fn(*args, **kwargs), context)

    def _blocking_loop(self, what: str) -> asyncio.AbstractEventLoop:
        """The loop a sync call runs on, refusing a caller that is on an event loop itself."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise EffectLedgerValidationError(
                f"{what} blocks until the call is done, and it was called on a running event "
                "loop, which it would stall (heartbeats included). From async code, await "
                "the tool (or ledger.run()) instead.",
                field="loop",
            )
        with self._lock:  # two threads' first calls start one loop
            if self._closing or self._store_closed:
                raise EffectLedgerValidationError(
                    "this ledger was closed with close_sync()"
                    + (
                        " and its store with it: open a new ledger"
                        if self._store_closed
                        else " while this call started: call again once close_sync() returned"
                    ),
                    field="ledger",
                )
            home = self.loop
            background = self._background
            if background is not None and background.running:
                return background.loop
            if home is not None and home.is_running() and not home.is_closed():
                # Async code is driving the object on another thread (a sync
                # tool, running in a worker thread, calls another tool): run
                # there, where the store lives.
                return home
            self._background = BackgroundLoop(name="agent-ledger-sync")
            return self._background.loop

    def adopt(self, background: BackgroundLoop, *, owns_store: bool) -> None:
        """Use ``background`` for sync calls: the store was opened on it (``agent_ledger.sync``)."""
        self._background = background
        self.loop = background.loop
        self._owns_store = owns_store

    def close(self, close_store: Callable[[], Awaitable[None]], timeout_s: float) -> None:
        """Stop the background loop: cancel the calls still running there, then
        ``close_store()`` if the store was opened on it, then end its thread.
        Idempotent; a no-op when no background loop runs. See
        ``EffectLedger.close_sync``."""
        with self._lock:
            background = self._background
            if background is None or not background.running or self._closing:
                return
            self._closing = True  # no sync call is routed anywhere meanwhile
        try:
            # Calls still running end first (recording their effects
            # canceled), while the store is open; none can start after.
            background.drain()
            if self._owns_store:
                self._store_closed = True
                background.run_closing(close_store())
        finally:
            background.stop(timeout_s)
            with self._lock:
                self._background = None
                if self.loop is background.loop:
                    self.loop = None
                self._closing = False


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
