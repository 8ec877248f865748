"""The steps that make a run an effect's owner, carried to their end when it is cancelled.

A run owns an effect once its ``begin`` inserted it as ``processing`` or a
``claim`` took it. A cancellation that lands while such a step waits for its
reply does not stop the step: SQLite's thread finishes the job it started,
and PostgreSQL may have run the statement before psycopg's cancel request
arrives. The effect would then sit in ``processing`` with no owner until its
lease ran out, and be taken over (counted as an execution, though no handler
ran).

So, outside a caller's transaction, :func:`own` runs the step in a task of its
own: a cancellation of the caller stops only the caller's wait, and the
caller keeps waiting (through further cancellations) until the step ends,
unless the step is still waiting for another task's transaction to end,
before doing anything (a store says so, ``stores.base.waiting_before_work``):
then it is cancelled there, and the caller's cancellation goes through at
once instead of waiting out someone else's transaction.
If the step made the caller the owner, the effect is given back
(``Store.release``: ``ready`` again, claimable at once), then the
cancellation propagates. Inside a caller's transaction none of this is
needed: the cancellation rolls the transaction back, with the step.

Cost, measured per ``begin`` against a direct await: about 1 µs. :func:`own`
starts the step by hand, in the caller's task, so a step that never waits
(MemoryStore's) finishes without a task switch (a task and two turns of the
event loop cost about 11 µs on 3.11); only a step that waits is carried on in
a task. (Not an eager task on 3.12+: see :class:`_Resumed`.) On SQLite and
PostgreSQL (a ``run()`` costs about 1 ms) the difference was lost in the
noise: paired medians of 0 to 50 µs. There is no cheaper exact way: awaiting
the step directly and then reading the effect back cannot tell our insert or
claim from another caller's, and psycopg gives up waiting for a cancelled
statement after 5 s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from agent_ledger.context import StepProgress, reset_step_progress, track_step_progress
from agent_ledger.effects import Effect
from agent_ledger.engine.cancellation import until_done
from agent_ledger.errors import EffectInFlightError
from agent_ledger.observability import effect_fields, log_effect, logger
from agent_ledger.stores.base import Store

__all__ = ["Pending", "finish", "own", "start"]

T = TypeVar("T")


class _Resumed:
    """Awaiting this goes on with a coroutine that was started by hand and is
    suspended on ``waiting_on`` (what its first ``send`` yielded).

    :func:`own` starts the step itself, in the caller's task: a step that
    never waits (MemoryStore's) then ends without a task or a turn of the
    event loop, and whatever the step checks before its first wait sees the
    caller as the current task (a store refuses a step from the task that
    holds its transaction open: in a task of the step's own, even an eager
    one, that check could not tell, and the step would wait for ever). One
    that does wait is handed to a task that runs this: it yields the step's
    pending future to the task, exactly as the step would have, and relays
    what comes back (values, exceptions and the task's cancellation) into the
    step, as ``yield from`` would.
    """

    __slots__ = ("_step", "_waiting_on")

    def __init__(self, step: Coroutine[Any, Any, T], waiting_on: object) -> None:
        self._step = step
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        step, pending = self._step, self._waiting_on
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                step.close()
                raise
            except BaseException as exc:  # relayed into the step, as `yield from` does
                try:
                    pending = step.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                pending = step.send(sent)
            except StopIteration as done:
                return done.value


async def _resume(step: Coroutine[Any, Any, T], waiting_on: object) -> T:
    result: T = await _Resumed(step, waiting_on)
    return result


class Pending(Generic[T]):
    """A step :func:`start` began that now waits: :func:`finish` carries it on."""

    __slots__ = ("progress", "step", "waiting_on")

    def __init__(
        self, step: Coroutine[Any, Any, T], waiting_on: object, progress: StepProgress
    ) -> None:
        self.step = step
        self.waiting_on = waiting_on
        self.progress = progress


def start(step: Coroutine[Any, Any, T]) -> T | Pending[T]:
    """Run ``step`` (a begin, claim, park or mark_started outside any caller's
    transaction) in the caller's task up to its first wait: its outcome if it
    ended without waiting (MemoryStore's do: no task, no coroutine frame of
    ours), else a :class:`Pending` for :func:`finish`. :func:`own` is the two."""
    progress = StepProgress()
    started = track_step_progress(progress)
    try:
        waiting_on = step.send(None)
    except StopIteration as done:
        # Ended without waiting: no cancellation could land meanwhile.
        result: T = done.value
        return result
    finally:
        reset_step_progress(started)
    return Pending(step, waiting_on, progress)


async def own(
    store: Store,
    step: Coroutine[Any, Any, T],
    owned: Callable[[T], Effect | None],
    *,
    name: str,
    held: Effect | None = None,
) -> T:
    """Await ``step`` (a begin, claim, park or mark_started outside any caller's
    transaction) and return its outcome; ``owned(outcome)`` names the effect it
    made ours, if any; ``held`` is one we owned before the step (the run whose
    handler's start ``mark_started`` records).

    If this task is cancelled meanwhile, wait for the step to end (or stop it
    while it still waits before doing anything), release the effect that is
    ours (made so by the step, else ``held``), and raise the cancellation.
    ``name`` is the step's name, for the log.
    """
    started = start(step)
    if isinstance(started, Pending):
        return await finish(store, started, owned, name=name, held=held)
    return started


async def finish(
    store: Store,
    pending: Pending[T],
    owned: Callable[[T], Effect | None],
    *,
    name: str,
    held: Effect | None = None,
) -> T:
    """:func:`own` for a step :func:`start` left waiting: carried on in a task."""
    progress = pending.progress
    task = asyncio.get_running_loop().create_task(_resume(pending.step, pending.waiting_on))
    if not task.done():
        # Not `await task` (our cancellation would cancel the step too) and
        # not asyncio.shield (one more future and loop turn): a future of our
        # own that the task's end resolves.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        task.add_done_callback(functools.partial(_wake, waiter))
        try:
            await waiter
        except asyncio.CancelledError as exc:
            if progress.waiting:
                # Still waiting out another task's transaction: nothing done,
                # so stop it there rather than wait for that transaction.
                task.cancel()
                await until_done(task)
                if task.cancelled():
                    if held is not None:
                        await _release(store, held, exc)
                    raise
            await _give_back(store, task, owned, name, exc, held)
    return task.result()


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _give_back(
    store: Store,
    task: asyncio.Task[T],
    owned: Callable[[T], Effect | None],
    name: str,
    interrupted: asyncio.CancelledError,
    held: Effect | None,
) -> None:
    """Wait for the interrupted ``task``, release what is ours, raise ``interrupted``."""
    await until_done(task)
    if task.cancelled():
        raise interrupted  # the loop is closing: nothing left to wait for
    error = task.exception()
    effect = None
    if isinstance(error, EffectInFlightError) and error.status is None:
        pass  # its wait for another transaction's lock ran out: it did nothing
    elif error is not None:
        # The step failed: it made nobody the owner (or, after a lost reply,
        # nobody can tell; the lease then decides, as after any store error).
        logger.warning("%s failed while the run was being cancelled", name, exc_info=error)
    else:
        effect = owned(task.result())
    if effect is None:
        effect = held  # ours before the step: its handler never started
    if effect is None:
        raise interrupted
    await _release(store, effect, interrupted)


async def _release(store: Store, effect: Effect, interrupted: asyncio.CancelledError) -> None:
    """Give ``effect`` back (fenced by its attempt) through cancellations; raise ``interrupted``."""
    release = asyncio.get_running_loop().create_task(
        store.release(effect.id, attempt=effect.attempt)
    )
    await until_done(release)
    if release.cancelled():
        raise interrupted
    error = release.exception()
    if error is not None:
        logger.error(
            "could not give back an effect whose run was cancelled before its handler "
            "started; it stays processing until its lease runs out, then is taken over",
            exc_info=error,
            extra=effect_fields(effect),
        )
    elif release.result():
        log_effect(
            logging.INFO, "effect given back: the run was cancelled before its handler", effect
        )
    else:
        # Someone moved it meanwhile (a person cancelled it): nothing to give back.
        log_effect(logging.INFO, "effect not given back: it changed meanwhile", effect)
    raise interrupted
