"""The batched evaluation engine: many configurations in, one figure-of-merit row each out.

    from sim.search.batch import Candidate, evaluate
    rows = evaluate([Candidate(schedule="1f1b", devices=4, microbatches=m, tag=m) for m in (4, 8, 16)], jobs=2)
    rows[0].makespan, rows[0].utilization, rows[0].peak_memory    # one Evaluation per candidate, same order

`pipesim sweep` and `pipesim plan` both ask thousands of what-if questions; this module is
the one place that answers them. Each :class:`Candidate` is simulated exactly (the fast
engine of :func:`sim.simulate`) and reduced to an :class:`Evaluation` - plain numbers, no
timeline, no DataFrame - so thousands of them stay cheap to move between processes.
A candidate's ``runtime`` (:mod:`sim.model.runtimes`) travels with it to whichever worker runs it: the default,
``pipesim``, is the engines' eager model; ``torch`` and ``megatron`` run the schedule lowered to that runtime's
sends, receives and waits on rendezvous links (:func:`sim.simulate.simulate_runtime`).

Where the work runs (*executor*; every choice gives the same rows, bit for bit, in the order given):

- ``"processes"``: *jobs* worker processes on this machine (``jobs=1``: in this process);
- ``"dask"``: a :class:`distributed.LocalCluster` of *jobs* single-threaded workers, started and closed here;
- ``"dask=tcp://HOST:PORT"``: the workers of an existing Dask scheduler (each needs pipesim installed).

Work travels in batches of contiguous candidates (not one round trip per candidate), and a
worker keeps the schedules it generated, keyed by (schedule, K, M, chunks, iterations), so a
planner trying many costs on one shape generates it once: candidates are evaluated grouped by
that key (the rows still come back in the order given), and a recomputing variant is the cached
schedule through the recompute pass (no generator reads ``recompute``: :func:`sim.schedules.generate`
is ``lower(generator(cfg), recompute=...)``), so it is not generated again.

A configuration that its schedule or its inputs reject (any :class:`sim.errors.PipesimError`:
M < K for a schedule that needs M >= K, costs for the wrong number of stages, ...) becomes an
Evaluation whose ``error`` holds the one-line reason and whose figures are NaN; any other
exception is a bug and propagates. Ctrl-C or SIGTERM stops the workers at once.

Units: seconds (as the costs), bytes, samples per second.
"""

from __future__ import annotations

import math
import multiprocessing
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from sim import jit
from sim.schedules import registry as generators
from sim import schedules
from sim.model.cost import StageCosts, uniform
from sim.errors import PipesimError, PipesimTypeError, Terminated
from sim.model.hardware import Hardware
from sim.core.ir import Schedule
from sim.core.passes import add_recompute
from sim.limits import check_fits
from sim.model.runtimes import DEFAULT_RUNTIME, get_runtime
from sim.search.worker_pool import WorkerSession, interrupts_held, release_held_interrupts, terminate_pool

__all__ = ["Candidate", "Evaluation", "evaluate", "BatchError", "EXECUTORS", "check_executor", "resolve_chunks",
           "check_runtime", "cached_schedule", "compiled_for", "worker_session"]

EXECUTORS = ("processes", "dask", "dask=tcp://HOST:PORT")
"""What *executor* accepts (the last one with a real scheduler address)."""

_BATCHES_PER_WORKER = 8     # enough batches to balance uneven candidates (large K, M cost more) ...
_MAX_BATCH = 256            # ... and small enough that the progress bar moves
_SCHEDULE_CACHE_SIZE = 256  # generated schedules kept per worker (a K=64, M=1024 schedule is a few MB) ...
_SCHEDULE_CACHE_ACTIONS = 2_000_000  # ... and at most this many actions among them (~100 MB of schedule arrays)
_COMPILE_FROM_ACTIONS = 200_000  # this many actions in all run every schedule compiled (see _compiled_kernel_for)
_CONNECT_TIMEOUT_S = 10.0   # seconds for reaching an existing Dask scheduler, its handshake included
_MAX_HANDSHAKE_BYTES = 1 << 20  # a scheduler's handshake is a few hundred bytes (distributed 2026.8: 58)


class BatchError(PipesimError):
    """Arguments of :func:`evaluate` that cannot run: a bad *jobs*, an unknown *executor*, Dask missing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One configuration to evaluate."""

    schedule: str
    """Registered schedule name (``pipesim schedules``), e.g. ``"1f1b"``."""
    devices: int
    """K, pipeline devices."""
    microbatches: int
    """M, micro-batches per iteration."""
    chunks: int | None = None
    """Model chunks per device; None: the schedule's own (see :func:`resolve_chunks`)."""
    recompute: bool = False
    """Re-materialize activations (recompute forwards before backwards)."""
    iterations: int = 1
    """N, iterations run back to back."""
    costs: StageCosts | None = None
    """Per-stage costs, one entry per stage (K x chunks); None: uniform stages, forward 1 and backward 2 per
    device's share of the model (each chunk costs 1/chunks), as ``pipesim sweep`` without cost flags."""
    hardware: Hardware | None = None
    """Devices and links for K devices; None: free links (transfers take no time)."""
    microbatch_size: float = 1.0
    """Samples per micro-batch, for throughput."""
    runtime: str = DEFAULT_RUNTIME
    """The runtime that executes the schedule (:mod:`sim.model.runtimes`: ``"pipesim"``, ``"torch"``,
    ``"megatron"``); the default runs the engines' eager model exactly as :func:`sim.simulate.simulate` without one."""
    post_overhead: float = 0.0
    """Seconds each posted batch of sends and receives holds its device (:func:`sim.simulate.simulate`)."""
    tag: object = None
    """The caller's key, returned unchanged in the Evaluation (must be picklable for other processes)."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one candidate gave; figures are NaN (tuples empty) when ``error`` is set."""

    tag: object
    """The candidate's tag."""
    makespan: float
    """Seconds from the first start to the last end."""
    utilization: float
    """Busy share of K x makespan."""
    bubble_fraction: float
    """1 - utilization (GPipe's bubble)."""
    bubble_ratio: float
    """Idle over busy time (Megatron's bubble over the ideal time)."""
    throughput: float
    """Samples per second (micro-batches x iterations x micro-batch size / makespan)."""
    peak_memory: tuple[float, ...]
    """Per device: the most bytes held at once."""
    peak_inflight: tuple[int, ...]
    """Per device: the most micro-batches with activations held at once."""
    weight_versions: tuple[int, ...]
    """Per device: the most weight versions held at once (PipeDream's stashing)."""
    memory_overflows: int
    """How many devices exceed the hardware's memory capacity (0 without a capacity)."""
    error: str
    """'' when the candidate ran; else the one-line reason it was rejected."""

    @property
    def ok(self) -> bool:
        return not self.error

    @classmethod
    def rejected(cls, tag: object, reason: str) -> Evaluation:
        """The evaluation of a candidate refused for *reason* (one line): NaN figures, empty per-device tuples."""
        nan = math.nan
        return cls(tag, nan, nan, nan, nan, nan, (), (), (), 0, reason)


def check_runtime(runtime: object, post_overhead: object = 0.0, where: str = "") -> str:
    """The profile name of *runtime* (a name :func:`sim.model.runtimes.get_runtime` knows, any case), after checking
    *post_overhead* (finite seconds >= 0); an unknown name or a bad number raises, one line naming *where*."""
    if not isinstance(runtime, str):
        raise PipesimTypeError(f"{where}runtime is a {type(runtime).__name__}; give a runtime name such as 'torch'")
    name = get_runtime(runtime).name  # UnknownRuntimeError lists the known names
    if isinstance(post_overhead, bool) or not isinstance(post_overhead, (int, float)) \
            or not 0 <= post_overhead < math.inf:
        raise BatchError(f"{where}post_overhead must be a finite number of seconds >= 0, got {post_overhead!r}")
    return name


def resolve_chunks(schedule: str, chunks: int | None) -> int:
    """Chunks per device that *schedule* runs with when asked for *chunks* (None: its own default,
    :func:`sim.schedules.registry.default_chunks`: 2 for V shapes and interleaved 1F1B, else 1)."""
    return chunks if chunks is not None else generators.default_chunks(schedule)


def evaluate(candidates: Iterable[Candidate], *, jobs: int = 1, executor: str = "processes",
             progress: bool = False) -> list[Evaluation]:
    """Evaluate every candidate; one :class:`Evaluation` per candidate, in the order given.

    *jobs*: worker processes (``"processes"``: 1 runs here, in this process) or Dask workers
    started for ``"dask"``; ignored for an existing scheduler (it has its own workers).
    *executor*: ``"processes"``, ``"dask"`` or ``"dask=tcp://HOST:PORT"`` (module docstring).
    *progress*: a tqdm bar on stderr once the work takes longer than half a second.
    """
    candidates = list(candidates)
    for i, c in enumerate(candidates):
        if not isinstance(c, Candidate):
            raise BatchError(f"candidates[{i}] is a {type(c).__name__}, not a sim.search.batch.Candidate")
        if c.costs is not None and not isinstance(c.costs, StageCosts):
            raise PipesimTypeError(f"candidates[{i}].costs is a {type(c.costs).__name__}; give a "
                                   f"sim.model.cost.StageCosts (e.g. sim.model.cost.uniform(K, forward=...)) or None")
        if c.hardware is not None and not isinstance(c.hardware, Hardware):
            raise PipesimTypeError(f"candidates[{i}].hardware is a {type(c.hardware).__name__}; give a "
                                   f"sim.model.hardware.Hardware or None")
        if not isinstance(c.recompute, (bool, np.bool_)):  # generate() would fail inside its size check
            raise PipesimTypeError(f"candidates[{i}].recompute is {c.recompute!r}, a {type(c.recompute).__name__}; "
                                   f"give True (re-run each forward before its backward) or False")
        if (c.runtime, c.post_overhead) != (DEFAULT_RUNTIME, 0.0):  # the caller's mistake: raised before any work
            check_runtime(c.runtime, c.post_overhead, f"candidates[{i}].")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BatchError(f"jobs must be a positive integer, got {jobs!r}")
    run = _executor(executor)
    if not candidates:
        return []
    compiled = sum(map(_actions, candidates)) >= _COMPILE_FROM_ACTIONS  # worth loading the compiled kernel
    # one shape's candidates next to each other, groups in the order of their first candidate, so a worker's cache
    # generates each shape once (a planner interleaves shapes: 1,773 look-ups of 484 schedules made 723
    # generations in the 405B benchmark's order)
    first: dict[tuple, int] = {}
    group = [first.setdefault(_shape_key(c), len(first)) for c in candidates]
    order = sorted(range(len(candidates)), key=group.__getitem__)
    session = _session.get()
    if session is not None and (executor, jobs) == ("processes", session.jobs):  # each shape on its home worker
        positions, homes = _affine_batches(candidates, order, group, list(first), session)
        run = lambda work, jobs: session.run(list(zip(homes, work)), _evaluate_indexed_batch)  # noqa: E731
    else:
        workers = jobs if executor != "processes" else min(jobs, len(candidates))
        positions = [order[a:b] for a, b in _batches(len(candidates), workers)]  # candidate indices per batch
    work = [(index, [candidates[i] for i in at], compiled) for index, at in enumerate(positions)]
    out: list[Evaluation | None] = [None] * len(candidates)
    with _progress_bar(len(candidates), progress) as advance:
        for index, rows in run(work, jobs):
            for i, row in zip(positions[index], rows):
                out[i] = row
            advance(len(rows))
    return out


def _affine_batches(candidates: Sequence[Candidate], order: list[int], group: list[int], keys: list[tuple],
                    session: WorkerSession) -> tuple[list[list[int]], list[int]]:
    """Batches for a :class:`~sim.search.worker_pool.WorkerSession`: every shape group whole on its home worker
    (weighed by its actions, so that new shapes spread evenly), each worker's share cut into batches of at most
    :data:`_MAX_BATCH` candidates (an eighth of the share, for the progress bar); returns each batch's candidate
    indices and its worker."""
    members: list[list[int]] = [[] for _ in keys]
    for i in order:
        members[group[i]].append(i)
    owners = session.assign([(key, 1 + sum(_actions(candidates[i]) for i in m)) for key, m in zip(keys, members)])
    shares: list[list[int]] = [[] for _ in range(session.jobs)]
    for owner, m in zip(owners, members):
        shares[owner].extend(m)
    positions, homes = [], []
    for worker, share in enumerate(shares):
        size = max(1, min(_MAX_BATCH, math.ceil(len(share) / _BATCHES_PER_WORKER)))
        for a in range(0, len(share), size):
            positions.append(share[a:a + size])
            homes.append(worker)
    return positions, homes


_session: ContextVar[WorkerSession | None] = ContextVar("pipesim_worker_session", default=None)


@contextmanager
def worker_session(jobs: int) -> Iterator[WorkerSession | None]:
    """Within the block, :func:`evaluate` calls with this *jobs* (and the default executor) share *jobs* worker
    processes that keep the schedules they generated, each shape on one worker (:mod:`sim.search.worker_pool`).
    One job, or a platform without fork: nothing changes (None)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 2 or not WorkerSession.available():
        yield None
        return
    session = WorkerSession(jobs, initializer=_worker_ignores_sigint)
    token = _session.set(session)
    try:
        with _sigterm_as_interrupt():
            yield session
    except BaseException:
        session.terminate()
        raise
    else:
        session.close()
    finally:
        _session.reset(token)


def _shape_key(c: Candidate) -> tuple[str, ...]:
    """What the schedule of *c* depends on, as strings (any input sorts; bad ones are refused later, per row).
    Recompute is left out: both variants come from one generated schedule (:func:`_cached`)."""
    return tuple(repr(v) for v in (c.schedule, c.devices, c.chunks, c.iterations, c.microbatches))


# ---------------------------------------------------------------------------------------------------------------
# one candidate (runs in a worker)

# (schedule, K, M, chunks, iterations, recompute) -> the generated Schedule, or the PipesimError that refused it;
# recompute False is generated, True is derived from it (_cached)
_schedule_cache: OrderedDict[tuple, Schedule | PipesimError] = OrderedDict()
_cached_actions = [0]  # the actions of the Schedules in _schedule_cache, kept as they come and go


def _size(found: Schedule | PipesimError) -> int:
    return len(found) if isinstance(found, Schedule) else 0


def _schedule_for(c: Candidate, chunks: int) -> Schedule:
    found = _cached(c.schedule, c.devices, c.microbatches, chunks, c.iterations, c.recompute)
    if isinstance(found, PipesimError):
        raise found
    return found


def cached_schedule(name: str, devices: int, microbatches: int, chunks: int, iterations: int = 1,
                    recompute: bool = False) -> Schedule | PipesimError:
    """``schedules.generate(name, devices, microbatches, chunks=chunks, ...)`` (its keys, placement and structure;
    a recomputing one is derived from the validated recompute-free one, :func:`_with_recompute`), or the
    PipesimError it raised, from this process's cache of generated schedules (what this process evaluates)."""
    return _cached(name, devices, microbatches, chunks, iterations, recompute)


def _cached(name: str, devices: int, microbatches: int, chunks: int, iterations: int,
            recompute: bool) -> Schedule | PipesimError:
    key = (name, devices, microbatches, chunks, iterations, recompute)
    try:
        found = _schedule_cache[key]
        _schedule_cache.move_to_end(key)
    except KeyError:
        if recompute is True:
            found = _recompute_fits(name, devices, microbatches, chunks, iterations)
            if found is None:
                base = _cached(name, devices, microbatches, chunks, iterations, False)
                found = base if isinstance(base, PipesimError) else _with_recompute(base)
        else:  # False, or a value generate() itself refuses in its own words
            try:
                found = schedules.generate(name, devices, microbatches, iterations=iterations, chunks=chunks,
                                           recompute=recompute)
                found.validate()
            except PipesimError as exc:
                found = exc
        _schedule_cache[key] = found
        _cached_actions[0] = _size(found) + (_cached_actions[0] if len(_schedule_cache) > 1 else 0)  # (re)counted
        # bounded in count and in actions: 64 schedules of a few million actions each would hold gigabytes
        while len(_schedule_cache) > 1 and (len(_schedule_cache) > _SCHEDULE_CACHE_SIZE
                                            or _cached_actions[0] > _SCHEDULE_CACHE_ACTIONS):
            _cached_actions[0] -= _size(_schedule_cache.popitem(last=False)[1])
    return found


def _recompute_fits(name: str, K: int, M: int, chunks: int, N: int) -> PipesimError | None:
    """The refusal ``schedules.generate(..., recompute=True)`` raises first for its size (one R more per F than
    without recompute: the same check, message and order as there), or None."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (K, M, chunks, N)):
        return None  # generate() names the bad value, through the recompute-free twin
    try:
        check_fits(K * chunks * M * N * 4, f"{name} with K={K}, M={M}, iterations={N}, chunks={chunks}")
    except PipesimError as exc:
        return exc
    return None


def _with_recompute(base: Schedule) -> Schedule | PipesimError:
    """What ``schedules.generate(..., recompute=True)`` returns, from its validated recompute-free twin *base*: the
    same recompute pass (sim.core.passes.add_recompute), without a second deadlock search. Each R(s, m) lands just
    before B(s, m) on B's device and needs only F(s, m), which B already waited for, so it cannot deadlock what ran
    without it; the structure is still checked (the fast engine does) and tests/test_plan_speed.py compares the
    result with generate()'s own."""
    try:
        return add_recompute(base).check_structure()
    except PipesimError as exc:
        return exc


def _costs_for(c: Candidate, schedule: Schedule, chunks: int) -> StageCosts:
    if c.costs is None:
        devices_share = uniform(schedule.stages // chunks)
        return devices_share.split_into_chunks(chunks) if chunks > 1 else devices_share
    if c.costs.stages != schedule.stages:
        raise BatchError(f"the costs have {c.costs.stages} stages but {c.schedule} with K={c.devices} and "
                         f"{chunks} chunk(s) per device has {schedule.stages}; give one entry per stage")
    return c.costs


def _hardware_for(c: Candidate) -> Hardware:
    if c.hardware is None:
        return Hardware(devices=c.devices)
    if c.hardware.devices != c.devices:
        raise BatchError(f"the hardware describes {c.hardware.devices} devices but the candidate has K={c.devices}")
    return c.hardware


def _evaluate_one(c: Candidate) -> Evaluation:
    from sim.simulate import simulate  # here, not at the top: the parent of a process pool never simulates

    try:
        if c.schedule not in generators.REGISTRY:
            generators.get_generator(c.schedule)  # raises, listing the valid names
        if isinstance(c.microbatch_size, bool) or not isinstance(c.microbatch_size, (int, float)) \
                or not 0 < c.microbatch_size < math.inf:
            raise BatchError(f"microbatch_size must be a positive finite number, got {c.microbatch_size!r}")
        chunks = resolve_chunks(c.schedule, c.chunks)
        schedule = _schedule_for(c, chunks)
        with jit.signals_deferred():  # one block for the simulation's kernel calls, not one per call
            # the default runtime takes simulate()'s eager path, the very floats of a call without one
            result = simulate(schedule, _costs_for(c, schedule, chunks), _hardware_for(c),
                              microbatch_size=c.microbatch_size, runtime=c.runtime, post_overhead=c.post_overhead)
    except PipesimError as exc:
        return _rejected(c.tag, exc)
    except ValueError as exc:  # the registry's miss (a plain ValueError): the candidate's input, not a bug
        if c.schedule in generators.REGISTRY:
            raise
        return _rejected(c.tag, exc)
    m = result.metrics
    return Evaluation(c.tag, float(m.makespan), float(m.utilization), float(m.bubble_fraction),
                      float(m.bubble_ratio), float(m.throughput), tuple(float(v) for v in m.peak_memory),
                      tuple(int(v) for v in m.peak_inflight), tuple(int(v) for v in m.weight_versions),
                      len(m.memory_overflow), "")


def _rejected(tag: object, exc: Exception) -> Evaluation:
    return Evaluation.rejected(tag, (str(exc).splitlines() or [type(exc).__name__])[0] or type(exc).__name__)


def _evaluate_batch(batch: Sequence[Candidate], *, compiled: bool = False) -> list[Evaluation]:
    """A list of candidates in, their evaluations out; *compiled*: every schedule on the compiled kernel."""
    if compiled and not jit.loaded():
        # now, not at the first large schedule: until numba is loaded a deadlock search (schedule.validate) runs
        # numpy waves for up to a second of this process (sim.core.listsched.NUMBA_STARTUP_SECONDS), which a batch
        # that loads numba anyway does not need (the 405B plan: 88 schedules, ~0.7 s); the floats are the same
        _load_compiled_kernel()
    with _compiled_kernel_for(compiled):
        return [_evaluate_one(c) for c in batch]


def _compiled_kernel_for(enabled: bool):
    """Run even small schedules on the numba-compiled kernel while many candidates are evaluated.

    :data:`sim.jit.COMPILE_MIN_ACTIONS` spares a one-off small run the ~1 s of loading numba; a batch
    pays that once and then runs each schedule tens of times faster (the 2,048-configuration sweep: 6.6 CPU s
    interpreted, 3.8 compiled). The interpreted kernel does ~0.15 M actions/s, so from ~200 k actions in all
    the load pays for itself. Both give the same floats (sim.core.listsched), so results do not depend on it.
    The choice holds for this thread's work only (:func:`sim.jit.prefer_compiled`).
    """
    return jit.prefer_compiled() if enabled else nullcontext()


@contextmanager
def compiled_for(candidates: Sequence[Candidate]) -> Iterator[None]:
    """A block (this thread's work) that evaluates *candidates*, in one :func:`evaluate` call or several, and
    around them generates and simulates the same shapes (a planner's placements, re-splits and winner): when the
    candidates together reach the actions where loading numba pays (:data:`_COMPILE_FROM_ACTIONS`), numba is
    loaded now and every schedule of the block runs the compiled kernels (the floats are the same). Without it
    each evaluate() call decides alone, and what runs before the first large one (a planner's probes of a few
    hundred small schedules, its deadlock searches) spends the one-off command's budget of numpy waves
    (:data:`sim.core.listsched.NUMBA_STARTUP_SECONDS`) before numba is loaded anyway: ~1 s in the 405B plan."""
    if sum(map(_actions, candidates)) < _COMPILE_FROM_ACTIONS:
        yield
        return
    _load_compiled_kernel()
    with jit.prefer_compiled():
        yield


def _load_compiled_kernel() -> None:
    """Load numba and the compiled kernels a simulation runs, in this process (before a pool forks: in every worker).

    numba is imported first: until it is, :func:`sim.core.listsched.list_schedule` answers a one-off run with numpy
    waves rather than loading it, so a small run alone would load nothing. Then a small simulation on links, with
    memory, under :func:`sim.jit.prefer_compiled` loads each kernel it calls (schedule, plan, memory)."""
    import numba  # noqa: F401

    from sim.simulate import simulate  # here, as in _evaluate_one: importing batch simulates nothing

    with jit.prefer_compiled():
        simulate(schedules.generate("zb-h1", 2, 4), uniform(2, activation_bytes=1.0),
                 Hardware(devices=2, latency=1e-6, bandwidth=1e9, memory_capacity=1e12))


def _batches(n: int, workers: int) -> list[tuple[int, int]]:
    """[start, end) index ranges cutting n candidates into contiguous batches for *workers* workers."""
    if workers <= 1:
        size = min(n, _MAX_BATCH)
    else:
        size = max(1, min(_MAX_BATCH, math.ceil(n / (workers * _BATCHES_PER_WORKER))))
    return [(a, min(a + size, n)) for a in range(0, n, size)]


# ---------------------------------------------------------------------------------------------------------------
# executors: each takes the batches and jobs, yields (batch index, evaluations) as batches finish

Work = tuple[int, list[Candidate], bool]
"""One batch: its index, its candidates, whether to run them on the compiled kernel."""
Runner = Callable[[list[Work], int], Iterator[tuple[int, list[Evaluation]]]]


def check_executor(executor: object) -> None:
    """Refuse an *executor* string :func:`evaluate` would not take (BatchError), before any work."""
    _executor(executor)


def _executor(executor: object) -> Runner:
    if executor == "processes":
        return _run_processes
    if executor == "dask":
        return _run_dask_local
    if isinstance(executor, str) and executor.startswith("dask="):
        address = executor[len("dask="):].strip()
        host, port = _scheduler_address(address)
        return lambda batches, jobs: _run_dask(batches, address=address, probe=(host, port))
    raise BatchError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")


def _run_processes(batches: list[Work], jobs: int) -> Iterator[tuple[int, list[Evaluation]]]:
    if jobs == 1 or len(batches) == 1:
        for item in batches:
            yield _evaluate_indexed_batch(item)
        return
    # fork where the platform has it: the workers start with sim already imported (spawn re-imports it, ~0.5 s)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "fork" and any(compiled for _, _, compiled in batches):
        _load_compiled_kernel()  # once here, inherited by every worker, instead of once per worker
    context = multiprocessing.get_context(method)
    with _sigterm_as_interrupt():
        pool = None
        try:
            with interrupts_held():  # an interrupt while the pool starts arrives once it is ours to terminate
                pool = context.Pool(processes=min(jobs, len(batches)), initializer=_worker_ignores_sigint)
            yield from pool.imap_unordered(_evaluate_indexed_batch, batches)
            pool.close()
        finally:
            # Normal end: the workers already exited. Ctrl-C, SIGTERM or an error: terminate() sends SIGTERM to
            # every worker now, rather than letting them finish their batches (what made Ctrl-C take a minute).
            if pool is not None:
                terminate_pool(pool)


def _actions(c: Candidate) -> int:
    """Roughly how many actions *c*'s schedule has (F and B per stage and micro-batch, W and R where used)."""
    chunks = c.chunks if isinstance(c.chunks, int) and c.chunks > 0 else 2
    per_pair = 2 + (1 if c.recompute else 0)
    sizes = (c.devices, c.microbatches, c.iterations)
    if not all(isinstance(v, int) and v > 0 for v in sizes):
        return 0
    return per_pair * c.devices * chunks * c.microbatches * c.iterations


def _evaluate_indexed_batch(item: Work) -> tuple[int, list[Evaluation]]:
    index, batch, compiled = item
    return index, _evaluate_batch(batch, compiled=compiled)


def _worker_ignores_sigint() -> None:
    # Ctrl-C reaches the whole process group; the parent alone decides to stop, and then terminates the workers.
    # forked while the parent held them (worker_pool.interrupts_held): these handlers, then unblocked
    release_held_interrupts({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL})


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While workers run, SIGTERM raises :class:`~sim.errors.Terminated` (a KeyboardInterrupt) here, so the pool is
    torn down as for Ctrl-C also where no command line installed that handler (a script calling evaluate())."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated(f"signal {signum}")  # a KeyboardInterrupt: the same teardown; the CLI exits 143

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise BatchError("the Dask executor needs dask's distributed package: "
                         "pip install 'pipesim[dask]' (or 'dask[distributed]')") from None
    return distributed


def _run_dask_local(batches: list[Work], jobs: int) -> Iterator[tuple[int, list[Evaluation]]]:
    distributed = _import_distributed()
    with _sigterm_as_interrupt():
        # single-threaded worker processes: the simulator holds the GIL, so threads would not add speed
        cluster = distributed.LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=40)
        try:
            yield from _run_dask(batches, address=cluster)
        finally:
            cluster.close()


def _run_dask(batches: list[Work], *, address, probe: tuple[str, int] | None = None) \
        -> Iterator[tuple[int, list[Evaluation]]]:
    distributed = _import_distributed()
    if probe is not None:  # an address typed by a user: make sure a Dask scheduler answers there first
        _probe_scheduler(address, *probe, timeout=_CONNECT_TIMEOUT_S)
    try:
        client = distributed.Client(address, timeout=_CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise BatchError(f"cannot reach the Dask scheduler at {address}: {exc}".splitlines()[0]) from None
    try:
        futures = [client.submit(_evaluate_indexed_batch, item, pure=False) for item in batches]
        try:
            for future in distributed.as_completed(futures, loop=client.loop):
                yield future.result()
        finally:
            client.cancel([f for f in futures if not f.done()])
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------------------------
# a running Dask scheduler's address, checked before distributed.Client sees it (issue 26.3)
#
# distributed.Client times out connecting, not the handshake after it: its connect() waits for the
# scheduler's first message with no limit (distributed/comm/core.py, connect: `handshake = await
# comm.read()`), so a listener that never speaks (a web server waiting for a request, the dashboard on
# 8787 given by mistake) hangs it for good; and it sizes its read buffer from the first 8 bytes it gets
# (distributed/comm/tcp.py, TCP.read), so a server that answers "HTTP/1.1 400" asks for 3.07 EiB.
# The probe below reads that first message itself, within the deadline, and checks its size first.

_ADDRESS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)")
_OTHER_SCHEMES = {
    "tls": "needs certificates, which pipesim's command line does not pass (use evaluate() with a "
           "distributed.Client of your own, or an SSH tunnel to the scheduler's tcp:// port)",
    "inproc": "reaches only a scheduler inside this same process; use --executor dask for a local cluster",
    "ucx": "needs UCX and ucx-py on every machine; pipesim's command line speaks tcp:// only",
    "ws": "is Dask's websocket transport; pipesim's command line speaks tcp:// only",
    "wss": "is Dask's websocket transport; pipesim's command line speaks tcp:// only",
}


def _scheduler_address(address: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT`` (IPv6 as ``tcp://[::1]:8786``); any other form is a BatchError
    saying which form it takes. Checked before any work: nothing is contacted here."""
    form = "give the scheduler's address as dask=tcp://HOST:PORT (the address `dask scheduler` prints)"
    match = _ADDRESS.fullmatch(address)
    if match is None:
        raise BatchError(f"executor 'dask={address}': {form}")
    scheme, rest = match["scheme"].lower(), match["rest"]
    if scheme != "tcp":
        why = _OTHER_SCHEMES.get(scheme, "is no Dask transport pipesim can use")
        raise BatchError(f"executor 'dask={address}': the scheme {scheme}:// {why}; {form}")
    if rest.startswith("["):  # [IPv6]:port
        host, _, port = rest[1:].partition("]")
        port = port[1:] if port.startswith(":") else ""
    else:
        host, _, port = rest.rpartition(":")
    if not host or not re.fullmatch(r"[A-Za-z0-9.:_-]+", host) or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise BatchError(f"executor 'dask={address}': expected tcp://HOST:PORT with a port from 1 to 65535; {form}")
    return host, int(port)


def _probe_scheduler(address: str, host: str, port: int, *, timeout: float) -> None:
    """Connect to *host*:*port* and read a Dask scheduler's handshake, all within *timeout* seconds; a
    BatchError names what answered instead. A Dask server speaks first (it writes its handshake as it
    accepts, distributed/comm/core.py, Listener.on_connection), framed as 8 bytes of length then the frames,
    themselves a count and the length of each (distributed/protocol/utils.py, pack_frames). The probe sends
    the same handshake back, a peer with the server's own settings, so the scheduler logs no failed one."""
    deadline = time.monotonic() + timeout
    where = f"the Dask scheduler at {address}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            head = _receive(sock, 8, deadline)
            (size,) = struct.unpack("<Q", head)
            if not 16 <= size <= _MAX_HANDSHAKE_BYTES:
                raise BatchError(f"{address} is not a Dask scheduler: it answered {head!r}..., not Dask's handshake "
                                 f"(is it a web server, or the dashboard's port, 8787, instead of the scheduler's, "
                                 f"usually 8786?)")
            body = _receive(sock, size, deadline)
            (count,) = struct.unpack_from("<Q", body)
            lengths = struct.unpack_from(f"<{count}Q", body, 8) if 0 < count <= 64 and 8 * (1 + count) <= size else ()
            if not lengths or 8 * (1 + count) + sum(lengths) != size:
                raise BatchError(f"{address} is not a Dask scheduler: its first message is not framed as Dask's "
                                 f"handshake; give the address `dask scheduler` prints")
            sock.sendall(head + body)
    except TimeoutError:
        raise BatchError(f"{where} did not answer as one within {timeout:g} s (a listener that stays silent, or a "
                         f"web server waiting for a request?); give the address `dask scheduler` prints") from None
    except OSError as exc:
        raise BatchError(f"cannot reach {where}: {exc.strerror or exc}") from None


def _receive(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly *n* bytes from *sock* before *deadline* (time.monotonic()); TimeoutError past it."""
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the connection was closed after {len(data)} bytes")
        data += chunk
    return bytes(data)


@contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    if not enabled:
        yield lambda n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc="evaluate", unit="config", file=sys.stderr, delay=0.5, leave=False) as bar:
        yield bar.update
