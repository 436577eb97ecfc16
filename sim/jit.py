"""Loop kernels compiled by numba, when numba is there: loaded on first use, never by ``import sim``.

A kernel is a plain Python function over numpy arrays written so numba can compile it. Compiled
kernels are cached on disk (next to their module, or where ``NUMBA_CACHE_DIR`` says); without a
writable cache they are compiled once per process. Importing numba and loading a cached kernel
costs about a second, so callers use them only where that pays (see :func:`loaded`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["compiled", "loaded", "kernel_for"]

_kernels: dict[Callable, Callable | None] = {}


def compiled(kernel: Callable) -> Callable | None:
    """*kernel* compiled by numba (once per process), or None without numba."""
    if kernel not in _kernels:
        try:
            import numba
        except ImportError:
            _kernels[kernel] = None
            return None
        try:
            _kernels[kernel] = numba.njit(cache=True, nogil=True)(kernel)
        except RuntimeError:  # no writable cache directory ("cannot cache function"): compile once per process
            _kernels[kernel] = numba.njit(nogil=True)(kernel)
    return _kernels[kernel]


def loaded() -> bool:
    """Whether this process has loaded numba already: then one more compiled kernel costs milliseconds, not a
    second (a sweep, a notebook, a benchmark; not a one-off command that never needed it)."""
    return sys.modules.get("numba") is not None


def kernel_for(kernel: Callable, actions: int) -> Callable | None:
    """*kernel* compiled, where that pays: numba already loaded in this process and a run of at least
    :data:`sim.fastpath.COMPILE_MIN_ACTIONS` actions (the compiled list scheduler's rule, which a batch lowers to
    0); None: run the numpy twin. Every kernel and its twin give the same numbers (the tests hold them to it)."""
    if actions < _fastpath().COMPILE_MIN_ACTIONS or not loaded():
        return None
    return compiled(kernel)


def _fastpath():
    """:mod:`sim.fastpath` (which imports this module: it cannot be imported at the top), looked up once."""
    global _fastpath_module
    if _fastpath_module is None:
        from . import fastpath

        _fastpath_module = fastpath
    return _fastpath_module


_fastpath_module = None
