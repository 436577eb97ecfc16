"""simulate(): a schedule, its costs and the hardware in; a Result out."""

from __future__ import annotations

import math

import numpy as np

from sim.model.cost import StageCosts, check_totals
from sim.errors import PipesimError, PipesimTypeError, quote, real_number
from sim.engines.fastpath import run_fast
from sim.model.hardware import Hardware
from sim.core.ir import Schedule
from sim.limits import check_fits
from sim.engines.plan import OverlapFB, make_plan
from sim.model.runtimes import DEFAULT_RUNTIME, RuntimeProfile, get_runtime
from sim.results.result import Result, make_result

__all__ = ["simulate", "simulate_runtime", "ENGINES", "SimulateError"]

ENGINES = ("auto", "fast", "simpy")
MAX_JITTER = 1e100
"""Largest jitter accepted: far past any real variation, and far from where its square overflows (1.3e154)."""


class SimulateError(PipesimError):
    """An option of :func:`simulate` it cannot honour (engine, jitter, micro-batch size)."""


def simulate(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *,
             microbatch_size: float = 1.0, engine: str = "auto", jitter: float = 0.0, seed: int = 0,
             overlap_fb: OverlapFB | None = None, runtime: str | RuntimeProfile = DEFAULT_RUNTIME,
             post_overhead: float = 0.0) -> Result:
    """Simulate one run of *schedule*.

    *runtime*: which runtime executes it (:mod:`sim.model.runtimes`): ``"pipesim"`` (default: eager links, the
    engines' own model), ``"torch"``, ``"megatron"`` or ``"deepspeed"`` (the schedule lowered to that runtime's
    sends, receives and waits, rendezvous links: :func:`simulate_runtime`, whose wait spans this drops). The
    result's notes name it.
    *post_overhead*: seconds each posted batch of sends and receives holds its device (the runtime's call that
    posts it); with it even the ``pipesim`` profile runs lowered.

    *engine*: ``"simpy"`` (general: also models ``jitter``, the coefficient of
    variation of computation times), ``"fast"`` (exact list scheduler, deterministic
    only), or ``"auto"`` (fast unless jitter is asked for). Both give identical
    timelines where both apply.

    *overlap_fb*: how long the schedule's overlapped forward-backward pairs last
    (:class:`~sim.engines.plan.OverlapFB`; default F + B).
    """
    profile = get_runtime(runtime)
    if profile.name != DEFAULT_RUNTIME or post_overhead != 0.0:
        return simulate_runtime(schedule, costs, hardware, runtime=profile, microbatch_size=microbatch_size,
                                engine=engine, jitter=jitter, seed=seed, overlap_fb=overlap_fb,
                                post_overhead=post_overhead)[0]
    plan, use_simpy, microbatch_size = _prepare(schedule, costs, hardware, microbatch_size, engine, jitter,
                                                overlap_fb)
    if use_simpy:
        from sim.engines.simpy_engine import run_simpy  # here, not at the top: simpy is loaded only when asked for

        built = run_simpy(plan, jitter=jitter, seed=seed)
    else:
        built = run_fast(plan)
    return _result(plan, built, microbatch_size)


def simulate_runtime(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *,
                     runtime: str | RuntimeProfile, microbatch_size: float = 1.0, engine: str = "auto",
                     jitter: float = 0.0, seed: int = 0, overlap_fb: OverlapFB | None = None,
                     post_overhead: float = 0.0, durations=None, send_call=None, recv_call=None,
                     link_seconds=None, link_bound=None, sender_seconds=None, note: str | None = None):
    """Simulate *schedule* as *runtime* executes it: lowered to its sends, receives and waits
    (:mod:`sim.core.comm_lowering`) and run under its link semantics (:mod:`sim.engines.rendezvous`, or its simpy
    twin for ``engine="simpy"`` and jitter). Returns the :class:`Result` and the
    :class:`~sim.engines.rendezvous.ProgramRun` (the program, and the spans each device spent blocked in waits).

    Per-action and per-operation times, as a trace measures them (:mod:`validate.ingest.messages`; None: the
    costs' and hardware's), each float[n] in the schedule's flat order (``schedule.compiled.flat``), a transfer
    indexed by the action whose result it carries (entries of actions that send nothing are not read):
    *durations*, each computation's seconds instead of its stage and kind's cost (NaN: the cost's); *send_call* / *recv_call*, how
    long the call that posts a transfer's send / receive holds its device (the engines' ``item_seconds``, the
    operation posted as its call returns); *link_seconds*, how long it holds its link (NaN: the hardware's time),
    *link_bound*, an upper bound on the hardware's time where *link_seconds* is NaN (inf: none);
    *sender_seconds*, from its start to its sender's wait returning (NaN: its own link time). *note* replaces the
    result's note on what the run modelled.

    A runtime whose overlapped pairs do not start as one unit
    (:attr:`~sim.model.runtimes.RuntimeProfile.pairs_wait_as_one`: PyTorch's runs a pair's forward, then its
    backward, each waiting its own receive) is timed on the schedule without its pairs, which still place its sends.

    A posting order that can never match (a deadlock only rendezvous links create) raises
    :class:`~sim.core.ir.ScheduleError` naming the stuck operations, before any timed run: the program is first
    walked with zero costs.
    """
    from dataclasses import replace

    from sim.core.comm_lowering import lower
    from sim.engines.rendezvous import run_program

    profile = get_runtime(runtime)
    post_overhead = real_number(post_overhead, "post_overhead")
    if not 0 <= post_overhead < math.inf:
        raise SimulateError(f"post_overhead must be a finite number of seconds >= 0, got {post_overhead!r}")
    # a runtime that runs a pair's two actions one by one, each waiting its own inputs (PyTorch's), is timed on
    # the schedule without its pairs; the pairs still place its sends, after the whole pair (the lowering)
    timed = (schedule if profile.pairs_wait_as_one or not len(schedule.fused)
             else schedule.replace_actions(schedule.actions))
    if overlap_fb is not None and timed is not schedule:
        raise SimulateError(f"runtime {profile.name} runs an overlapped pair's forward and backward one after the "
                            f"other: overlap_fb (--overlap-fb) does not apply to it")
    plan, use_simpy, microbatch_size = _prepare(timed, costs, hardware, microbatch_size, engine, jitter,
                                                overlap_fb)
    schedule.validate()  # the schedule's own deadlocks first, in the schedule's words
    program = lower(schedule, profile.lowering(schedule), blocking_sends=not plan.hardware.overlap)
    zero = make_plan(timed, StageCosts(forward=[0.0] * schedule.stages, backward=[0.0] * schedule.stages),
                     Hardware(devices=schedule.devices))
    run_program(zero, program, eager=profile.eager)  # raises on a posting order that cannot match
    n = len(plan.flat.keys)
    given = {name: None if v is None else _per_action(v, n, name) for name, v in (
        ("durations", durations), ("send_call", send_call), ("recv_call", recv_call),
        ("link_seconds", link_seconds), ("link_bound", link_bound), ("sender_seconds", sender_seconds))}
    if given["durations"] is not None:
        plan = replace(plan, durations=np.where(np.isnan(given["durations"]), plan.durations, given["durations"]),
                       _views={})
    if given["link_seconds"] is not None or given["link_bound"] is not None:
        seconds = plan.send_seconds
        if given["link_bound"] is not None:
            seconds = np.minimum(seconds, given["link_bound"])
        if given["link_seconds"] is not None:
            seconds = np.where(np.isnan(given["link_seconds"]), seconds, given["link_seconds"])
        plan = replace(plan, send_seconds=seconds, _views={})
    sender = given["sender_seconds"]
    if sender is not None:
        sender = np.where(np.isnan(sender), plan.send_seconds, sender)
    items = None
    if given["send_call"] is not None or given["recv_call"] is not None:
        # one entry per batch item of the program: a send of transfer p (item p) or a receive of it (item ~p)
        item = program.batch_item
        calls = [np.zeros(n) if c is None else c for c in (given["send_call"], given["recv_call"])]
        items = np.where(item >= 0, calls[0][np.where(item >= 0, item, 0)], calls[1][np.where(item < 0, ~item, 0)])
    kw = {"post_seconds": post_overhead, "item_seconds": items, "sender_seconds": sender}
    if use_simpy:
        from sim.engines.simpy_program import run_simpy_program

        ran = run_simpy_program(plan, program, eager=profile.eager, jitter=jitter, seed=seed, **kw)
    else:
        ran = run_program(plan, program, eager=profile.eager, **kw)
    result = _result(plan, ran.run, microbatch_size)
    result.notes.append(f"runtime {profile.name} ({profile.links} links, lowering {program.lowering}): "
                        + (note or profile.description))
    return result, ran


def _per_action(values, n: int, name: str) -> np.ndarray:
    """*values* as float[n]: NaN (where the argument allows it) or finite seconds >= 0; anything else is the
    caller's bug (ValueError), not user input."""
    out = np.asarray(values, dtype=float)
    if out.shape != (n,) or (out < 0).any() or np.isneginf(out).any() or (np.isposinf(out).any()
                                                                         and name != "link_bound"):
        raise ValueError(f"{name} must be {n} seconds >= 0, one per action in the schedule's flat order")
    if np.isnan(out).any() and name not in ("durations", "link_seconds", "sender_seconds"):
        raise ValueError(f"{name} must not hold NaN")
    return out


def _prepare(schedule, costs, hardware, microbatch_size, engine, jitter, overlap_fb):
    """The checks every simulation makes, and its plan: (plan, whether simpy runs it, the micro-batch size)."""
    _check_types(schedule, costs, hardware)
    if engine not in ENGINES:
        raise SimulateError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    jitter, microbatch_size = real_number(jitter, "jitter"), real_number(microbatch_size, "microbatch_size")
    if not 0 <= jitter <= MAX_JITTER:  # the engine squares it (sim.engines.simpy_engine): past ~1e154 every duration is nan
        raise SimulateError(f"jitter must be >= 0 and at most {MAX_JITTER:g} (a coefficient of variation: "
                            f"0.1 is 10 %), got {jitter!r}")
    if not 0 < microbatch_size < math.inf:
        raise SimulateError(f"microbatch_size must be a finite number > 0, got {microbatch_size!r}")
    if engine == "fast" and jitter > 0:
        raise SimulateError("the fast engine is deterministic; use engine='simpy' for jitter")
    hardware = hardware or Hardware(devices=schedule.devices)
    check_fits(len(schedule), f"schedule {schedule.name!r}")
    use_simpy = engine == "simpy" or jitter > 0
    if use_simpy:
        schedule.validate()  # simpy would just stop on a deadlock; find it first
    else:
        schedule.check_structure()  # a deadlock stalls the fast engine's list scheduler, which reports it
    check_totals(costs, schedule.total_microbatches)  # sums that would overflow to inf / nan, refused up front
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is refused just below, in words
        plan = make_plan(schedule, costs, hardware, overlap_fb)
    _check_transfers(plan)
    return plan, use_simpy, microbatch_size


def _result(plan, built, microbatch_size: float) -> Result:
    result = make_result(plan.schedule, plan.costs, plan.hardware, built, microbatch_size=microbatch_size)
    if not math.isfinite(result.metrics.makespan):  # e.g. a huge jitter on huge costs: never print inf or nan
        raise SimulateError(f"the simulated makespan overflows ({result.metrics.makespan}); use smaller costs or "
                            f"jitter")
    return result


def _check_types(schedule, costs, hardware) -> None:
    """Wrong types are a TypeError naming the argument (not an AttributeError deep inside the engine)."""
    for name, value, cls, takes in (
            ("schedule", schedule, Schedule, "a Schedule (e.g. sim.schedules.gpipe(4, 8))"),
            ("costs", costs, StageCosts, "a StageCosts (e.g. sim.uniform(4) or sim.model.cost.load_costs(path))"),
            ("hardware", hardware, (Hardware, type(None)), "a Hardware (e.g. Hardware(devices=4)) or None")):
        if not isinstance(value, cls):
            raise PipesimTypeError(f"{name} must be {takes}, got {type(value).__name__} {quote(value)}")


def _check_transfers(plan) -> None:
    """Transfer times are bytes / bandwidth: a huge size over a tiny bandwidth overflows where no cost does."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(plan.send_seconds.sum()) + float(plan.durations.sum())
    if not math.isfinite(total):
        raise PipesimError("the transfer times overflow (bytes / bandwidth past the largest float); check "
                           "--activation-bytes and --bandwidth (or the costs and hardware files) for a typo")
