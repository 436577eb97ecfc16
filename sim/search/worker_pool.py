"""Worker processes that outlive one :func:`sim.search.batch.evaluate` call and keep what they generated.

    from sim.search.batch import evaluate, worker_session
    with worker_session(jobs=2):          # the planner's whole search
        evaluate(probes, jobs=2)          # each schedule shape goes to one worker ...
        evaluate(candidates, jobs=2)      # ... and comes back to it: generated once, not once per call and worker

A process pool made per evaluate() call starts with the cache of generated schedules its parent had (fork), and the
parent never generates: so each call generated every shape again, in every worker that saw a piece of it. The
planner calls evaluate() three or four times on overlapping shapes, and ``plan --jobs 2`` took 9.6 s of CPU where
``--jobs 1`` took 4.7 (issue 25, bug a). A :class:`WorkerSession` keeps *jobs* single-process pools for as long as
its block runs; every schedule shape (the key :func:`sim.search.batch.evaluate` groups candidates by) has a home
worker, chosen the first time it comes (the least loaded worker of that call) and kept after, so a shape is
generated at most once per session. The rows are the same floats whichever process computes them.

Ctrl-C or SIGTERM while work runs, or an error in a worker, terminates every worker at once (as a per-call pool
does); the block's end closes them. Units: none (work is counted in the caller's weights, e.g. actions).
"""

from __future__ import annotations

import functools
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager

__all__ = ["WorkerSession", "interrupts_held", "release_held_interrupts", "terminate_pool"]

_HELD = (signal.SIGINT, signal.SIGTERM)
_replaced_handlers: dict[int, object] | None = None
"""The handlers the outermost running :func:`interrupts_held` replaced; a worker forked inside it takes them back
(:func:`release_held_interrupts`), as it would otherwise keep handlers that only take note of SIGTERM."""


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait (not lost) until the block ends, then arrive as usual.

    For starting worker pools: an interrupt inside ``multiprocessing.Pool()`` (CPython's constructor catches only
    ``Exception``) escapes with workers forked and no pool object for the caller to terminate (a ``plan`` given
    Ctrl-C as its workers started was once still running 60 s later, tests/test_plan_workers.py; this is one way
    that can happen). Held, the interrupt is raised when the block ends, where the caller holds the pools and can
    terminate them.

    Two holds, because a process-directed signal goes to any thread that does not block it (signal(7)), and a
    pipesim process has threads from the moment numpy is imported (OpenBLAS starts its own): the signal mask keeps
    it from this thread (and forked children inherit the mask: their initializer calls
    :func:`release_held_interrupts`); where another thread takes it, CPython still runs the Python-level handler in
    the main thread at its next check (``PyErr_CheckSignals``: ``os.kill`` to oneself checks at once), so while the
    block runs that handler only takes note, and what it noted is raised again (in this thread) at the end. CI once
    saw Ctrl-C raised inside the block with the mask alone. Off the main thread (Python handlers can only be set
    there) the mask alone holds; without ``pthread_sigmask``, the handlers alone. Unlike
    :func:`sim.jit.signals_deferred` this also holds a signal left at its default action (a default SIGTERM would
    end the parent at once, leaving forked workers that wait on a pipe they hold open themselves) and one that is
    ignored (it stays ignored: raised again at the end, the restored handler decides)."""
    global _replaced_handlers
    arrived: list[int] = []
    handlers = {number: signal.getsignal(number) for number in _HELD}
    # getsignal() gives None for a handler set outside Python, which signal() cannot put back: leave those alone
    swap = threading.current_thread() is threading.main_thread() and None not in handlers.values()
    outer = _replaced_handlers
    if swap:
        for number in _HELD:
            signal.signal(number, lambda signum, frame: arrived.append(signum))
        _replaced_handlers = handlers if outer is None else outer
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        # The mask first: a signal it held is delivered here, to the noting handler (or, off the main thread, raised
        # here). Restored after the handlers, a late signal (another thread's C handler runs when that thread gets a
        # core: on a loaded machine after the block) was raised by a handler already put back, out of this block
        # with the mask still set, and every later Ctrl-C stayed blocked: lost (seen under load, 3 runs in 12).
        if previous_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        if swap:
            late = _put_back(handlers)
            _replaced_handlers = outer
            if late is not None:
                raise late
        for number in dict.fromkeys(arrived):
            signal.raise_signal(number)  # to this thread, with the handler now in place (raised here if it raises)


def _put_back(handlers: dict[int, object]) -> BaseException | None:
    """Install every one of *handlers* again, also where a signal comes meanwhile: ``signal.signal()`` first runs
    the pending handlers (CPython's ``signal_signal_impl``), so one already put back may raise there before the
    next is in place. The first such exception is returned, to be raised once all are back."""
    late = None
    for number, handler in handlers.items():
        while True:
            try:
                signal.signal(number, handler)
                break
            except BaseException as exc:  # noqa: BLE001 - a KeyboardInterrupt here is kept and raised after the loop
                late = late or exc
    return late


def terminate_pool(pool, *, wait: float = 10.0) -> None:
    """``pool.terminate(); pool.join()``, never left waiting on CPython's teardown.

    ``Pool.terminate()`` joins the pool's task-handler thread, which may be blocked writing a queued task into the
    workers' pipe; once the workers are dead nobody reads it and the join never returns (a plan given Ctrl-C hung
    so, its stack in ``_handle_tasks`` -> ``send``); a worker killed while it waited for a task leaves the pipe's
    read lock taken, on which ``_help_stuff_finish`` waits (a sweep hung so). So the teardown runs in a daemon
    thread; where it has not finished after 2 s, every worker still there gets SIGKILL (it cannot be held or
    caught) and is reaped, and the teardown gets *wait* more seconds: what may still be blocked after that is the
    pool's own daemon threads, which hold no process and end with the interpreter."""
    def teardown() -> None:
        pool.terminate()  # stops the pool's worker handler first: no worker is started again behind us
        pool.join()

    closer = threading.Thread(target=teardown, name="pipesim-pool-teardown", daemon=True)
    closer.start()
    closer.join(timeout=2.0)
    if closer.is_alive():
        workers = list(getattr(pool, "_pool", ()))
        for w in workers:
            if w.exitcode is None:
                w.kill()
        for w in workers:
            w.join(timeout=wait)
        closer.join(timeout=wait)


def _start_worker(initializer: Callable[[], None] | None) -> None:
    """A session worker's first act: take back the interrupts it was forked with held, then the caller's setup."""
    release_held_interrupts()
    if initializer is not None:
        initializer()


def release_held_interrupts(handlers: dict[int, object] | None = None) -> None:
    """In a worker forked inside :func:`interrupts_held`: install *handlers* (signal -> handler; by default those
    the hold replaced), then unblock Ctrl-C and SIGTERM (a pending SIGTERM then meets them: with ``SIG_DFL`` it
    ends the worker, as ``Pool.terminate()`` means). Handlers first, so a pending signal never meets the hold's."""
    global _replaced_handlers
    for number, handler in (handlers if handlers is not None else _replaced_handlers or {}).items():
        signal.signal(number, handler)
    _replaced_handlers = None
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


class WorkerSession:
    """*jobs* worker processes, each a pool of one, started on first use (forked: they inherit the parent's loaded
    modules, numba's kernels included) and kept until :meth:`close`."""

    def __init__(self, jobs: int, initializer: Callable[[], None] | None = None) -> None:
        self.jobs = jobs
        """How many worker processes; evaluate() calls with another *jobs* do not use the session."""
        self._initializer = initializer
        self._pools: list | None = None
        self._home: dict[Hashable, int] = {}  # shape key -> the worker that has (or will have) it generated

    @staticmethod
    def available() -> bool:
        """Whether the platform can fork (a spawned worker re-imports everything and inherits nothing)."""
        return "fork" in multiprocessing.get_all_start_methods()

    def assign(self, groups: Sequence[tuple[Hashable, float]]) -> list[int]:
        """The worker of each (shape key, weight) group: its home if it has one, else the least loaded worker of
        this call (ties: the lowest index), which becomes its home. Deterministic for a given history."""
        load = [0.0] * self.jobs
        owners = []
        for key, weight in groups:
            worker = self._home.get(key)
            if worker is None:
                worker = min(range(self.jobs), key=load.__getitem__)
                self._home[key] = worker
            load[worker] += weight
            owners.append(worker)
        return owners

    def run(self, items: Sequence[tuple[int, object]], function: Callable[[object], object]) -> Iterator[object]:
        """``function(payload)`` for each (worker, payload) of *items*, in that worker, yielded as they finish."""
        done: queue.Queue = queue.Queue()
        try:
            pools = self._start()
            for worker, payload in items:
                pools[worker].apply_async(function, (payload,), callback=done.put,
                                          error_callback=lambda exc: done.put(_Failed(exc)))
            for _ in items:
                while True:
                    try:  # a bounded wait: Ctrl-C and SIGTERM's handler get the main thread between waits
                        got = done.get(timeout=0.2)
                        break
                    except queue.Empty:
                        continue
                if isinstance(got, _Failed):
                    raise got.exc
                yield got
        except BaseException:
            self.terminate()  # an error, Ctrl-C or SIGTERM: stop every worker now, not after its queue
            raise

    def _start(self) -> list:
        if self._pools is None:
            context = multiprocessing.get_context("fork")
            start = functools.partial(_start_worker, self._initializer)
            with interrupts_held():  # an interrupt while they start arrives once they are ours to terminate
                self._pools = [context.Pool(processes=1, initializer=start) for _ in range(self.jobs)]
        return self._pools

    def terminate(self) -> None:
        """Stop every worker at once (SIGTERM to each); the session then starts new ones if used again."""
        pools, self._pools = self._pools, None
        self._home.clear()  # new workers have nothing generated
        for pool in pools or ():
            terminate_pool(pool)

    def close(self) -> None:
        """Let the workers exit (their queues are empty once every run() was consumed) and wait for them."""
        pools, self._pools = self._pools, None
        self._home.clear()
        for pool in pools or ():
            pool.close()
        for pool in pools or ():
            pool.join()


class _Failed:
    """An exception raised in a worker, carried to the caller's thread."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
