"""Loop kernels compiled by numba: loaded on first use, never by ``import sim``.

A kernel is a plain Python function over numpy arrays written so numba can compile it. Compiled
kernels are cached on disk (next to their module, or where ``NUMBA_CACHE_DIR`` says); without a
writable cache they are compiled once per process. Importing numba and loading a cached kernel
costs about a second, so callers use them only where that pays (see :func:`kernel_for`); every kernel
has a twin (the same function interpreted, or numpy) that gives the same numbers (the tests hold them to it).

Where compiling pays is one rule, :func:`compile_min_actions`; a caller that runs many schedules (a batch, a
sweep) says so with :func:`prefer_compiled`, for its own thread of work only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["compiled", "loaded", "kernel_for", "compile_min_actions", "prefer_compiled", "compile_above",
           "COMPILE_MIN_ACTIONS"]

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
            _kernels[kernel] = numba.njit(cache=True, nogil=True)(kernel)
        except RuntimeError:  # no writable cache directory ("cannot cache function"): compile once per process
            _kernels[kernel] = numba.njit(nogil=True)(kernel)
    return _kernels[kernel]


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
