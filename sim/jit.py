"""Loop kernels compiled by numba: loaded on first use, never by ``import sim``.

A kernel is a plain Python function over numpy arrays written so numba can compile it. Compiled
kernels are cached on disk (next to their module, or where ``NUMBA_CACHE_DIR`` says); without a
writable cache they are compiled once per process. Importing numba and loading a cached kernel
costs about a second, so callers use them only where that pays (see :func:`kernel_for`); every kernel
has a twin (the same function interpreted, or numpy) that gives the same numbers (the tests hold them to it).

Where compiling pays is one rule, :func:`compile_min_actions`; a caller that runs many schedules (a batch, a
sweep) says so with :func:`prefer_compiled`, for its own thread of work only.

Ctrl-C and SIGTERM wait for the kernel that runs (:func:`signals_deferred`). Compiled code never looks at
signals, but it calls back into Python now and then (numba unpickles the constants of a kernel, even
of a cached one, through ``numba.core.serialize._numba_unpickle`` while it runs); a Python signal handler
that raises there leaves an exception set under a call that then returns a value: ``SystemError:
CPUDispatcher(...) returned a result with an exception set``, reported as our bug, or the interrupt is
lost and the run finishes with exit 0 (issue 26.7). So while a kernel runs, SIGINT and SIGTERM only
note that they came, and their own handlers run as soon as it returns. The longest kernel call (the
list scheduler of a 4.2 M-action run) takes about a second, so that is how late Ctrl-C can be; a batch
(:mod:`sim.search.batch`) holds signals back for one configuration's whole simulation, which is cheaper
than a block per kernel call (~12 us each, thousands per sweep) and as late as that simulation is long.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["compiled", "loaded", "kernel_for", "compile_min_actions", "prefer_compiled", "compile_above",
           "COMPILE_MIN_ACTIONS", "signals_deferred"]

DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals held back while a compiled kernel runs (module docstring)."""

COMPILE_MIN_ACTIONS = 2_000
"""Schedules with at least this many actions run the numba-compiled kernels; smaller ones run the same
functions interpreted (about 0.15 M actions/s: at most ~15 ms here), which spares a one-off small run
the ~1 s of importing numba and loading the compiled kernel (~4 s the very first time, while it is
compiled). Above it a process pays that load once, then every run is tens of times faster: what a
sweep, a notebook or a benchmark wants; a one-off CLI run of a few thousand actions is ~1 s slower."""

_min_actions: ContextVar[int | None] = ContextVar("pipesim_compile_min_actions", default=None)

_kernels: dict[Callable, Callable] = {}


def compiled(kernel: Callable) -> Callable:
    """*kernel* compiled by numba (once per process; numba is a dependency of pipesim)."""
    if kernel not in _kernels:
        import numba

        try:
            dispatcher = numba.njit(cache=True, nogil=True)(kernel)
        except RuntimeError:  # no writable cache directory ("cannot cache function"): compile once per process
            dispatcher = numba.njit(nogil=True)(kernel)
        _kernels[kernel] = _uninterrupted(dispatcher)
    return _kernels[kernel]


def _uninterrupted(dispatcher: Callable) -> Callable:
    """*dispatcher* called with SIGINT and SIGTERM held back until it returns (module docstring)."""
    @functools.wraps(dispatcher.py_func)
    def call(*args):
        if getattr(_deferring, "active", False):  # inside a caller's block already: no second one
            return dispatcher(*args)
        with signals_deferred():
            return dispatcher(*args)

    call.dispatcher = dispatcher  # the numba object itself, for whoever needs its signatures or statistics
    return call


_deferring = threading.local()


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM only note their arrival; on leaving it, the handlers that were
    installed run for each signal that came (Ctrl-C's raises KeyboardInterrupt there). A signal that is
    ignored or has its default action (which ends the process at once, running no Python) is left alone;
    outside the main thread, where Python runs no handler, the block changes nothing. Blocks nest: inside
    one, another (each compiled call makes one) costs nothing, so a caller that runs many short kernels
    (a batch, one simulation at a time) wraps them in one block, ~12 us, instead of one per call."""
    if threading.current_thread() is not threading.main_thread() or getattr(_deferring, "active", False):
        yield
        return
    arrived: list[int] = []

    def note(signum, frame):
        arrived.append(signum)

    previous = {}
    for signum in DEFERRED_SIGNALS:  # signal.signal returns the handler it replaces: no getsignal (~3 us each)
        handler = signal.signal(signum, note)
        if callable(handler):
            previous[signum] = handler
        else:  # ignored, or the default action: left as it was
            signal.signal(signum, handler)
    _deferring.active = True
    try:
        yield
    finally:
        _deferring.active = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):  # each signal once, in the order they came
            previous[signum](signum, None)


def loaded() -> bool:
    """Whether this process has loaded numba already: then one more compiled kernel costs milliseconds, not a
    second (a sweep, a notebook, a benchmark; not a one-off command that never needed it)."""
    return sys.modules.get("numba") is not None


def compile_min_actions() -> int:
    """The fewest actions for which a run uses a compiled kernel: :data:`COMPILE_MIN_ACTIONS`, unless the
    caller's context says otherwise (:func:`prefer_compiled`, :func:`compile_above`)."""
    chosen = _min_actions.get()
    return COMPILE_MIN_ACTIONS if chosen is None else chosen


@contextmanager
def compile_above(actions: int) -> Iterator[None]:
    """Within the block (this thread or task only: a context variable, not a global), runs of at least
    *actions* actions use the compiled kernels; ``compile_above(10**12)`` never compiles."""
    token = _min_actions.set(int(actions))
    try:
        yield
    finally:
        _min_actions.reset(token)


def prefer_compiled() -> contextmanager:
    """Within the block every run uses the compiled kernels: for callers that run many schedules (a batch pays
    numba's start-up once, and every small run is then faster compiled)."""
    return compile_above(0)


def kernel_for(kernel: Callable, actions: int) -> Callable | None:
    """*kernel* compiled, where that pays: numba already loaded in this process and a run of at least
    :func:`compile_min_actions` actions; None: run the twin."""
    if actions < compile_min_actions() or not loaded():
        return None
    return compiled(kernel)
