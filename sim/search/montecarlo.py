"""Monte Carlo: a schedule's step time as a distribution, not one number.

    import sim
    mc = sim.monte_carlo(sim.schedules.one_f_one_b(4, 8), sim.uniform(4), samples=1000,
                         variability="lognormal:0.1", stragglers=["device=2,factor=1.5,prob=0.2"], seed=0)
    mc.summary()["makespan_quantiles"]     # {"p50": ..., "p90": ..., "p99": ...}
    mc.sample_result(mc.quantile_sample(0.99)).timeline    # the p99 sample's full timeline

Every sample is the exact list scheduler of the fast engine with random durations (:mod:`sim.engines.sampling`:
all samples in one compiled call, seeded and reproducible; what varies: :mod:`sim.engines.variability`), with the
fast engine's runtime model: the costs' dispatch overhead before every action (fixed, not varied, not busy) and
DualPipeV's overlapped pairs. Under the ``torch`` and ``megatron`` runtime profiles (``runtime=``: rendezvous links
and their posting points, :mod:`sim.engines.rendezvous`) each sample draws the kernel's numbers and is walked by the
rendezvous engine, one compiled walk per sample (exact, slower; no pauses), whose recorded bounds give the sample's
critical path (:func:`sim.engines.rendezvous.critical_path`). The summary holds, for makespan, throughput and
bubble fraction, the mean, standard deviation and the p50, p90 and p99 quantiles; the deterministic run's figures
(``nominal_*``) beside them; and per device the share of samples in which it lies on the critical path and its mean
share of the critical path's seconds ("who made it slow"), under every runtime.

:func:`rank_by` names the statistics a sweep or a plan can rank by: ``mean``, ``p50``, ``p99`` (of the makespan;
a smaller makespan is better) or ``nominal`` (the deterministic run).

Quantiles are numpy's default (linear interpolation between order statistics); with N samples the standard error
of the p-quantile is about sqrt(p (1 - p) / N) / f(q_p) (the density at the quantile), so p99 needs about 1,000
samples to mean something: fewer than :data:`MIN_SAMPLES_P99` samples report it with a warning in ``notes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from sim.core.ir import Schedule
from sim.engines.plan import OverlapFB, Plan, make_plan
from sim.engines.sampling import SampleArrays, replay_sample, run_samples, topological_order
from sim.engines.variability import Distribution, Pause, SlowLink, Straggler, Variability
from sim.errors import PipesimError, PipesimTypeError, quote
from sim.limits import check_fits
from sim.model.cost import StageCosts, check_totals
from sim.model.hardware import Hardware
from sim.results.result import Result, make_result
from sim.results.timeline import EngineRun

__all__ = ["monte_carlo", "MonteCarlo", "MonteCarloError", "make_variability", "RANK_STATISTICS", "rank_by",
           "QUANTILES", "MAX_SAMPLES", "MIN_SAMPLES_P99"]

QUANTILES = (0.5, 0.9, 0.99)
"""The quantiles a summary reports (p50, p90, p99)."""
RANK_STATISTICS = ("mean", "p50", "p90", "p99", "nominal")
"""What a sweep or plan can rank the makespan (iteration time) by."""
MAX_SAMPLES = 10_000_000
"""Most samples one call takes (memory: about 8 x (3 + 3 K) bytes per sample are kept)."""
MIN_SAMPLES_P99 = 1_000
"""Below this many samples the p99 is an extrapolation from the last few order statistics: said in ``notes``."""


class MonteCarloError(PipesimError):
    """Arguments of a Monte Carlo run that cannot run (samples, seed, variability types)."""


def make_variability(variability: Variability | Distribution | str | None = None, *, links: str | None = None,
                     stragglers: Iterable[Straggler | str] = (), slow_links: Iterable[SlowLink | str] = (),
                     pause: Pause | str | None = None) -> Variability:
    """One :class:`~sim.engines.variability.Variability` from objects or their strings (module docstring)."""
    if isinstance(variability, Variability):
        if links or tuple(stragglers) or tuple(slow_links) or pause:
            raise MonteCarloError("give either a Variability object or the separate sources, not both")
        return variability
    if variability is not None and not isinstance(variability, (Distribution, str)):
        raise PipesimTypeError(f"variability must be a Variability, a Distribution, a string such as "
                               f"'lognormal:0.1', or None; got {type(variability).__name__} {quote(variability)}")
    if isinstance(stragglers, (str, Straggler)) or isinstance(slow_links, (str, SlowLink)):
        raise PipesimTypeError("stragglers and slow_links take a list (e.g. ['device=2,factor=1.5'])")
    compute = Distribution.parse(variability) if isinstance(variability, str) else (variability or Distribution())
    return Variability(compute=compute,
                       links=Distribution.parse(links, what="links") if links else Distribution(),
                       stragglers=tuple(s if isinstance(s, Straggler) else Straggler.parse(s) for s in stragglers),
                       slow_links=tuple(s if isinstance(s, SlowLink) else SlowLink.parse(s) for s in slow_links),
                       pause=pause if isinstance(pause, Pause) or pause is None else Pause.parse(pause))


@dataclass(frozen=True, eq=False)
class MonteCarlo:
    """The samples of one schedule under one variability (see the module docstring)."""

    plan: Plan
    """The schedule, costs and hardware with their planned (nominal) durations."""
    variability: Variability
    seed: int
    arrays: SampleArrays
    """Per sample: makespan, busy seconds, critical path (:class:`sim.engines.sampling.SampleArrays`)."""
    nominal: Result
    """The deterministic run (no variation)."""
    microbatch_size: float = 1.0
    notes: list[str] = field(default_factory=list)
    _order: np.ndarray | None = field(default=None, repr=False)
    runtime: str = "pipesim"
    """The runtime profile the samples ran under (:mod:`sim.model.runtimes`)."""
    program: object = field(default=None, repr=False)
    """Under another runtime than ``pipesim``: the lowered program every sample walked
    (:class:`sim.core.comm_lowering.CommProgram`)."""
    post_overhead: float = 0.0

    @property
    def schedule(self) -> Schedule:
        return self.plan.schedule

    @property
    def samples(self) -> int:
        return len(self.arrays.makespan)

    @property
    def makespan(self) -> np.ndarray:
        """Seconds, per sample."""
        return self.arrays.makespan

    @property
    def throughput(self) -> np.ndarray:
        """Samples (training samples) per second, per Monte Carlo sample."""
        work = self.schedule.total_microbatches * self.microbatch_size
        with np.errstate(divide="ignore"):
            return np.where(self.makespan > 0, work / np.where(self.makespan > 0, self.makespan, 1.0), np.inf)

    @property
    def bubble_fraction(self) -> np.ndarray:
        """Idle share of K x makespan, per sample (as :mod:`sim.results.metrics`; 0 for a run of no time)."""
        K = self.schedule.devices
        busy = self.arrays.busy.sum(axis=1)
        span = K * self.makespan
        return np.where(span > 0, 1.0 - busy / np.where(span > 0, span, 1.0), 0.0)

    def quantile_sample(self, q: float) -> int:
        """The sample whose makespan is the empirical q-quantile (the order statistic at rank ceil(q N) - 1), e.g.
        ``quantile_sample(0.99)`` for the Gantt of a slow step."""
        if not 0 <= q <= 1:
            raise MonteCarloError(f"a quantile is in [0, 1], got {q!r}")
        rank = min(max(math.ceil(q * self.samples) - 1, 0), self.samples - 1)
        return int(np.argsort(self.makespan, kind="stable")[rank])

    def sample_result(self, sample: int) -> Result:
        """Sample *sample* run again with its full timeline (same draws: the random numbers are counter-based).
        Its busy times include any pause an action ran into (the timeline cannot tell a pause from work)."""
        if not 0 <= sample < self.samples:
            raise MonteCarloError(f"sample {sample} is not one of 0..{self.samples - 1}")
        plan = self.plan
        if self.program is not None:  # walked by the rendezvous engine, as every sample was
            from sim.engines.rendezvous import run_program
            from sim.engines.sampling import draw_samples

            durations, sends = draw_samples(plan, self.variability, first=sample, count=1, seed=self.seed)
            run = run_program(_drawn_plan(plan, durations[0], sends[0]), self.program,
                              eager=self.program_eager, post_seconds=self.post_overhead).run
            return make_result(plan.schedule, plan.costs, plan.hardware, run, microbatch_size=self.microbatch_size,
                               notes=[f"Monte Carlo sample {sample} of seed {self.seed}, runtime {self.runtime}"])
        start, end, tx_start, tx_end = replay_sample(plan, self.variability, sample=sample, seed=self.seed,
                                                     order=self._order)
        flat = plan.flat
        run = EngineRun(plan.schedule, flat.keys, flat.device, flat.device_start, start, end, plan.link,
                        tx_start, tx_end, flat.send_to, plan.send_bytes)
        return make_result(plan.schedule, plan.costs, plan.hardware, run, microbatch_size=self.microbatch_size,
                           notes=[f"Monte Carlo sample {sample} of seed {self.seed}"])

    def summary(self) -> dict:
        """The JSON-ready figures (module docstring)."""
        m = self.nominal.metrics
        out: dict = {"samples": self.samples, "seed": self.seed, "variability": self.variability.describe()}
        for name, values, nominal in (("makespan", self.makespan, m.makespan),
                                      ("throughput", self.throughput, m.throughput),
                                      ("bubble", self.bubble_fraction, m.bubble_fraction)):
            out.update(_statistics(name, values))
            out[f"nominal_{name}"] = float(nominal)
        out["slowdown_mean"] = float(np.mean(self.makespan) / m.makespan) if m.makespan > 0 else 1.0
        out["runtime"] = self.runtime
        on_path = self.arrays.on_critical_path.mean(axis=0)
        seconds = self.arrays.critical_seconds
        total = seconds.sum(axis=1) + self.arrays.critical_link_seconds
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total[:, None] > 0, seconds / np.where(total > 0, total, 1.0)[:, None], 0.0).mean(axis=0)
            link_share = float(np.where(total > 0, self.arrays.critical_link_seconds / np.where(total > 0, total, 1),
                                        0.0).mean())
        out["critical_path"] = {
            "on_path_share": [float(v) for v in on_path],
            "time_share": [float(v) for v in share],
            "links_time_share": link_share,
            "slowest_device": int(np.argmax(share)) if len(share) else None,
        }
        out["notes"] = list(self.notes)
        return out

    @property
    def program_eager(self) -> bool:
        """Whether the runtime's links are eager (:attr:`sim.model.runtimes.RuntimeProfile.eager`)."""
        from sim.model.runtimes import get_runtime
        return get_runtime(self.runtime).eager

    def statistic(self, name: str) -> float:
        """The makespan's *name* (:data:`RANK_STATISTICS`)."""
        return rank_by(self, name)


def _statistics(name: str, values: np.ndarray) -> dict:
    finite = values[np.isfinite(values)]
    if not len(finite):
        nan = math.nan
        return {f"{name}_mean": nan, f"{name}_std": nan, f"{name}_quantiles": {f"p{round(q * 100)}": nan
                                                                              for q in QUANTILES}}
    if finite.min() == finite.max():  # every sample the same (nothing varies): that value and 0, not numpy's
        value = float(finite[0])      # pairwise mean of N copies, which can be off in the last bit
        return {f"{name}_mean": value, f"{name}_std": 0.0,
                f"{name}_quantiles": {f"p{round(q * 100)}": value for q in QUANTILES}}
    quantiles = np.quantile(finite, QUANTILES)
    return {f"{name}_mean": float(finite.mean()), f"{name}_std": float(finite.std(ddof=1)) if len(finite) > 1 else 0.0,
            f"{name}_quantiles": {f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, quantiles)}}


def rank_by(mc: MonteCarlo, statistic: str) -> float:
    """The makespan statistic a sweep or plan ranks by: ``mean``, ``p50``, ``p90``, ``p99`` or ``nominal``."""
    if statistic == "mean":
        return float(np.mean(mc.makespan))
    if statistic == "nominal":
        return float(mc.nominal.metrics.makespan)
    if statistic in ("p50", "p90", "p99"):
        return float(np.quantile(mc.makespan, int(statistic[1:]) / 100))
    raise MonteCarloError(f"unknown statistic {statistic!r}; rank by one of {', '.join(RANK_STATISTICS)}")


def monte_carlo(schedule: Schedule, costs: StageCosts, hardware: Hardware | None = None, *, samples: int = 1000,
                variability: Variability | Distribution | str | None = None, links: str | None = None,
                stragglers: Sequence[Straggler | str] = (), slow_links: Sequence[SlowLink | str] = (),
                pause: Pause | str | None = None, seed: int = 0, microbatch_size: float = 1.0,
                overlap_fb: OverlapFB | None = None, runtime: str = "pipesim",
                post_overhead: float = 0.0) -> MonteCarlo:
    """*samples* runs of *schedule* with random durations (module docstring), in one compiled call.

    *variability*: the computations' distribution (``"lognormal:0.1"``, ``"normal:0.05"``, ``"empirical:FILE"``, a
    :class:`~sim.engines.variability.Distribution`), or a whole :class:`~sim.engines.variability.Variability` (then
    leave the other sources out). *links*: the transfers' distribution. *stragglers*, *slow_links*: lists of
    :class:`~sim.engines.variability.Straggler` / :class:`~sim.engines.variability.SlowLink` or their strings
    (``"device=2,factor=1.5,prob=0.2"``, ``"src=0,dst=1,factor=3"``). *pause*: a
    :class:`~sim.engines.variability.Pause` or ``"every=0.5s,length=20ms"``. *seed*: the same seed gives the same
    samples, and two schedules run with one seed see the same draw for the same action. *overlap_fb*: how long
    overlapped forward-backward pairs last (:class:`~sim.engines.plan.OverlapFB`), as :func:`sim.simulate`.
    *runtime*, *post_overhead*: as :func:`sim.simulate`; a runtime other than ``pipesim`` (or a post overhead) runs
    each sample through the rendezvous engine instead (:func:`_program_monte_carlo`: exact, one compiled walk per
    sample, no pauses).
    """
    from sim.model.runtimes import get_runtime
    from sim.simulate import simulate  # the nominal run, with every check simulate() makes

    var = make_variability(variability, links=links, stragglers=stragglers, slow_links=slow_links, pause=pause)
    profile = get_runtime(runtime)
    if profile.name != "pipesim" or post_overhead:
        return _program_monte_carlo(schedule, costs, hardware, var, samples=samples, seed=seed,
                                    microbatch_size=microbatch_size, overlap_fb=overlap_fb, profile=profile,
                                    post_overhead=post_overhead)
    _check_samples(samples, seed)
    # the deterministic run, with every check simulate() makes (types, deadlocks, overflow)
    nominal = simulate(schedule, costs, hardware, microbatch_size=microbatch_size, overlap_fb=overlap_fb)
    check_fits(len(schedule), f"schedule {schedule.name!r}")
    check_totals(costs, schedule.total_microbatches)
    var.check_devices(schedule.devices)
    plan = make_plan(schedule, costs, nominal.hardware, overlap_fb)
    order = topological_order(plan)
    arrays = run_samples(plan, var, samples=int(samples), seed=int(seed), order=order)
    if not np.isfinite(arrays.makespan).all():
        raise MonteCarloError("a sampled makespan overflows; use smaller costs or factors")
    notes = []
    if samples < MIN_SAMPLES_P99:
        notes.append(f"{samples} samples: p99 rests on the last {max(1, samples // 100)} sample(s); use "
                     f">= {MIN_SAMPLES_P99} for a p99 worth quoting")
    if var.pause is not None:
        notes.append("pauses: busy seconds exclude the pauses, the sampled timelines' boxes include them")
    if plan.has_overhead:
        notes.append(f"dispatch overhead: {float(plan.overhead.sum()):.6g} s over the run, the same in every sample "
                     f"(the runtime's own time: not scaled by the variability or a straggler, not busy time)")
    if not var.active:
        notes.append("nothing varies: every sample is the deterministic run")
    return MonteCarlo(plan, var, int(seed), arrays, nominal, float(microbatch_size), notes, order)



def _check_samples(samples, seed) -> None:
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or not 1 <= samples <= MAX_SAMPLES:
        raise MonteCarloError(f"samples must be an integer in 1..{MAX_SAMPLES:,}, got {quote(samples)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise MonteCarloError(f"seed must be an integer >= 0, got {quote(seed)}")


_DRAW_CHUNK_BYTES = 64 << 20
"""The draws of the rendezvous path are made this many bytes at a time (two float64 arrays per sample)."""


def _program_monte_carlo(schedule, costs, hardware, var: Variability, *, samples, seed, microbatch_size, overlap_fb,
                         profile, post_overhead) -> MonteCarlo:
    """Monte Carlo under a runtime profile's lowering and link semantics (:mod:`sim.engines.rendezvous`): each sample
    draws exactly what the eager kernel draws for the same sample (:func:`sim.engines.sampling.draw_samples`;
    two runtimes compared with one seed see the same draws) and is walked by :func:`run_program`, the engine
    :func:`sim.simulate` uses for that runtime, so a sample with nothing varied is its deterministic run to the
    last bit. One compiled walk per sample, not one call for all: rendezvous walks park and resume devices, which
    the single-pass kernel's fixed topological order cannot express (a receive's post may come after the send's).
    Each sample's critical path is the one the walk recorded (:class:`sim.engines.rendezvous.CriticalPath`: a
    transfer's start may be set by its receiver's post, so the path can cross to either side of a rendezvous); its
    fields mean what the eager kernel's do (:class:`sim.engines.sampling.SampleArrays`), with posts' calls counted
    as their device's seconds."""
    from sim.core.comm_lowering import lower
    from sim.engines.rendezvous import run_program
    from sim.engines.sampling import draw_samples
    from sim.simulate import simulate_runtime

    _check_samples(samples, seed)
    if var.pause is not None:
        raise MonteCarloError(f"pauses are drawn while the schedule runs: Monte Carlo with --runtime {profile.name} "
                              f"does not take --pause; drop it or use --runtime pipesim")
    nominal, _ = simulate_runtime(schedule, costs, hardware, runtime=profile, microbatch_size=microbatch_size,
                                  overlap_fb=overlap_fb, post_overhead=post_overhead)  # its checks, its deadlocks
    check_fits(len(schedule), f"schedule {schedule.name!r}")
    var.check_devices(schedule.devices)
    plan = make_plan(schedule, costs, nominal.hardware, overlap_fb)
    program = lower(schedule, profile.lowering(schedule), blocking_sends=not plan.hardware.overlap)
    n, K = len(plan.flat.keys), schedule.devices
    out = SampleArrays(np.zeros(samples), np.zeros((samples, K)), np.zeros((samples, K), dtype=np.bool_),
                       np.zeros((samples, K)), np.zeros(samples))
    chunk = max(1, _DRAW_CHUNK_BYTES // (16 * max(n, 1)))
    for first in range(0, samples, chunk):
        count = min(chunk, samples - first)
        durations, sends = draw_samples(plan, var, first=first, count=count, seed=int(seed))
        for j in range(count):
            walked = run_program(_drawn_plan(plan, durations[j], sends[j]), program, eager=profile.eager,
                                 post_seconds=post_overhead)
            out.makespan[first + j] = walked.run.makespan
            out.busy[first + j] = np.bincount(plan.flat.device, weights=durations[j], minlength=K)
            path = walked.critical_path
            out.on_critical_path[first + j] = path.on_path
            out.critical_seconds[first + j] = path.device_seconds
            out.critical_link_seconds[first + j] = path.link_seconds
    if not np.isfinite(out.makespan).all():
        raise MonteCarloError("a sampled makespan overflows; use smaller costs or factors")
    notes = [f"runtime {profile.name} ({profile.links} links, lowering {program.lowering}): every sample walked by "
             f"the rendezvous engine"]
    if samples < MIN_SAMPLES_P99:
        notes.append(f"{samples} samples: p99 rests on the last {max(1, samples // 100)} sample(s); use "
                     f">= {MIN_SAMPLES_P99} for a p99 worth quoting")
    if not var.active:
        notes.append("nothing varies: every sample is the deterministic run")
    return MonteCarlo(plan, var, int(seed), out, nominal, float(microbatch_size), notes, None,
                      runtime=profile.name, program=program, post_overhead=float(post_overhead))


def _drawn_plan(plan: Plan, durations: np.ndarray, sends: np.ndarray) -> Plan:
    """*plan* with one sample's durations and transfer seconds (its cached views dropped)."""
    return replace(plan, durations=durations, send_seconds=sends, _views={})


# ---------------------------------------------------------------------------------------------- sweeps and plans
SWEEP_SAMPLE_UNITS: dict[str, tuple[str, str]] = {
    "samples": ("count", "Monte Carlo samples of the row"),
    **{f"makespan_{s}": ("s", f"makespan over the samples: {s}") for s in ("mean", "std", "p50", "p90", "p99")},
    **{f"throughput_{s}": ("samples/s", f"throughput over the samples: {s}") for s in ("mean", "p50", "p90", "p99")},
    **{f"bubble_{s}": ("fraction", f"bubble fraction over the samples: {s}") for s in ("mean", "p50", "p90", "p99")},
    "slowdown_mean": ("ratio", "mean makespan / the deterministic makespan"),
    "critical_device": ("index", "the device holding the largest mean share of the critical path"),
    "rank_by": ("", "the makespan statistic robust_rank orders by (mean, p50, p90, p99, nominal)"),
    "robust_rank": ("rank", "1 = the smallest makespan statistic per training sample (rank_by) among the rows "
                            "that ran"),
    "variability": ("", "what varied (JSON: compute, links, stragglers, slow_links, pause)"),
}
"""The columns :func:`sample_rows` adds to a sweep table (unit, meaning)."""


def sample_columns(mc: MonteCarlo) -> dict:
    """One row's Monte Carlo columns (:data:`SWEEP_SAMPLE_UNITS`, without the rank)."""
    import json

    d = mc.summary()
    row = {"samples": d["samples"], "makespan_mean": d["makespan_mean"], "makespan_std": d["makespan_std"]}
    for name in ("makespan", "throughput", "bubble"):
        if name != "makespan":
            row[f"{name}_mean"] = d[f"{name}_mean"]
        row.update({f"{name}_{q}": v for q, v in d[f"{name}_quantiles"].items()})
    row["slowdown_mean"] = d["slowdown_mean"]
    row["critical_device"] = d["critical_path"]["slowest_device"]
    row["variability"] = json.dumps(d["variability"], separators=(",", ":"))
    return row


def sample_rows(rows: Sequence[dict], *, variability: Variability, samples: int, seed: int = 0,
                rank: str = "mean", costs=None, hardware=None, microbatch_size: float = 1.0,
                runtime: str = "pipesim", post_overhead: float = 0.0) -> list[dict]:
    """The Monte Carlo columns of sweep rows (dicts with schedule, devices, microbatches, chunks, iterations,
    recompute and error), in order; rows with an error get none. *costs*, *hardware*: as
    :func:`sim.search.sweep.run_sweep` takes them (None, a mapping of uniform() / Hardware() arguments, or the
    object itself). Each row is one compiled call of *samples* samples with the same *seed* (paired rows). Rows are
    ranked by the *rank* statistic of the makespan divided by the training samples of the row (micro-batches x
    iterations x micro-batch size): rows of different M do different amounts of work. *runtime*, *post_overhead*:
    the runtime model every row is sampled under (:func:`monte_carlo`), as the sweep simulated them."""
    from sim import schedules
    from sim.model.cost import uniform

    if rank not in RANK_STATISTICS:
        raise MonteCarloError(f"unknown statistic {rank!r}; rank by one of {', '.join(RANK_STATISTICS)}")
    out: list[dict] = []
    for row in rows:
        if row.get("error"):
            out.append({})
            continue
        K, chunks = int(row["devices"]), int(row["chunks"])
        schedule = schedules.generate(row["schedule"], K, int(row["microbatches"]),
                                      iterations=int(row["iterations"]), recompute=bool(row["recompute"]),
                                      chunks=chunks)
        if isinstance(costs, StageCosts):
            row_costs = costs
        else:
            share = uniform(K, **dict(costs or {}))
            row_costs = share.split_into_chunks(chunks) if chunks > 1 else share
        row_hw = hardware if isinstance(hardware, Hardware) else Hardware(devices=K, **dict(hardware or {}))
        mc = monte_carlo(schedule, row_costs, row_hw, samples=samples, variability=variability, seed=seed,
                         microbatch_size=microbatch_size, runtime=runtime, post_overhead=post_overhead)
        columns = sample_columns(mc)
        columns["rank_by"] = rank
        # per training sample: rows of different M (or micro-batch size) do different amounts of work
        columns["_statistic"] = rank_by(mc, rank) / (schedule.total_microbatches * microbatch_size)
        out.append(columns)
    order = sorted((c["_statistic"], i) for i, c in enumerate(out) if c)
    for position, (_, i) in enumerate(order, start=1):
        out[i]["robust_rank"] = position
    for c in out:
        c.pop("_statistic", None)
    return out
