"""Injected variability for measured runs: every action of a rank lasts a duration drawn from the same distributions,
with the same random numbers, as the simulator's Monte Carlo (:mod:`sim.engines.sampling`).

``pipesim validate --inject SPEC`` (SPEC as ``simulate --samples``: ``lognormal:0.1``, ``normal:0.05``,
``straggler=device=2,factor=1.5,prob=0.2``, separated by ``;``). Run *r* of a rank uses the draws of Monte Carlo
sample *r* of the same seed, keyed by the action, so all ranks agree on which device straggles in which run without
talking to each other. The specification reaches the ranks in :attr:`validate.request.RunRequest.inject`.

- The emulated workload waits for its cost times the action's factor (a straggling device: times ``factor`` too).
- Real stages (mlp, transformer, the user's model; :class:`InjectedStage`) compute for real, then wait until the
  action has lasted its *padded* cost times its factor. Real compute cannot run faster than it does, so a factor
  below 1 could not shorten it; instead every action is padded to a baseline P above its real compute time
  (:func:`padded_costs` from the time measured alone, raised after the warm-up to its longest real time there,
  :meth:`InjectedStage.settle_padding`; times :data:`PAD_HEADROOM`, divided by the factor's 0.1 % quantile) and
  lasts P times its factor. Both sides see the same distribution: the prediction draws the same
  factors on P (:mod:`validate.injected`). An action whose real compute still overruns its drawn duration (a
  preempted rank) lasts its real time; the report counts such overruns (the realised minus drawn durations).

Transfers and pauses are not injected: transfers are real (gloo, NCCL), so ``--link-variability``, ``--slow-link``
and ``--pause`` are refused here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from sim.core.ir import OP_B, OP_F, OP_R, OP_U, OP_W, encode_key
from sim.engines import sampling
from sim.engines.variability import Distribution, Straggler, Variability, VariabilityError

from validate.request import InjectSpec

__all__ = ["InjectSpec", "Injector", "InjectedStage", "parse_inject", "attach_injectors", "padded_costs",
           "low_factor", "inject_real", "PAD_HEADROOM", "PAD_COLUMNS"]

PAD_HEADROOM = 2.5
"""A real action's baseline P is the longest of its time measured alone and its real times in the warm-up runs
(:meth:`InjectedStage.settle_padding`), times this, over the factor's 0.1 % quantile: room for the same computation
running slower in a timed run than in the warm-up (ranks sharing cores, other processes). On the shared 2-core
machine the real computations inside the schedule ran up to 5x their time alone at load 2.5 (mlp K=2, a 25 ms
forward). With 1.3 here, 300 timed runs of mlp K=2 M=8 1F1B (load 2.9-3.3) overran their drawn durations by more
than 1 ms in 980 of 10,200 actions (the warm-up's longest is the longest of 32 or so; the timed runs hold 5,000 of
each kind): the overruns, which the prediction cannot know, put the KS distance at 0.17. A wider margin costs only
waiting."""

PAD_COLUMNS = {OP_F: "forward", OP_B: "backward", OP_W: "weight", OP_R: "recompute", OP_U: "update"}
"""Kind ordinal (:mod:`sim.core.ir`) -> the cost column its baseline comes from."""

_Z_LOW = -3.090232306167813
"""The standard normal's 0.1 % quantile."""


def low_factor(spec: InjectSpec) -> float:
    """The 0.1 % quantile of the per-action factor (1 without a distribution; stragglers only lengthen): a real
    action padded to P / this lasts longer than its real compute in all but 1 in 1,000 draws.

    Lognormal of mean 1 and CV c: exp(mu + sigma z) with sigma^2 = ln(1 + c^2), mu = -sigma^2 / 2 (the sampler's
    parameters, :func:`sim.engines.sampling._factor`); normal: 1 + c z, floored at 0.05 (a normal of CV >= 0.31
    has more than 0.1 % of its mass that low: padding 20-fold is the most this run pays)."""
    dist = spec.variability().compute
    if not dist.active:
        return 1.0
    if dist.kind == "lognormal":
        sigma = math.sqrt(math.log1p(dist.cv ** 2))
        return math.exp(-sigma * sigma / 2 + sigma * _Z_LOW)
    return max(0.05, 1.0 + dist.cv * _Z_LOW)


def padded_costs(measured: dict[int, dict[str, float]], spec: InjectSpec) -> dict[int, dict[str, float]]:
    """stage -> {cost column: baseline P seconds} of real stages from their costs measured alone (*measured*: a
    rank's :attr:`validate.request.StageCalibration.before`): P = measured x :data:`PAD_HEADROOM` /
    :func:`low_factor`. An unsplit backward lasts P(backward) + P(weight), as the simulator's cost of B."""
    scale = PAD_HEADROOM / low_factor(spec)
    return {s: {col: float(per.get(col, 0.0)) * scale for col in PAD_COLUMNS.values()} for s, per in measured.items()}


def parse_inject(text: str, *, seed: int = 0) -> InjectSpec:
    """``lognormal:0.1;straggler=device=any,factor=1.5,prob=0.2`` -> :class:`InjectSpec` (one clear line on a
    mistake)."""
    compute, stragglers = "none", []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if part.startswith("straggler="):
            Straggler.parse(part[len("straggler="):])  # checked now, on the command line
            stragglers.append(part[len("straggler="):])
        elif part.split(":")[0].strip().lower() in ("lognormal", "normal", "none"):
            if compute != "none":
                raise VariabilityError(f"--inject gives two distributions ({compute} and {part}); give one")
            dist = Distribution.parse(part, what="--inject")
            compute = "none" if not dist.active else f"{dist.kind}:{dist.cv:g}"
        else:
            raise VariabilityError(f"--inject takes lognormal:CV or normal:CV and straggler=device=N|any,factor=F"
                                   f"[,prob=P], separated by ';'; got {part!r} (links and pauses are not injected: "
                                   f"transfers are real)")
    spec = InjectSpec(compute=compute, stragglers=tuple(stragglers), seed=seed)
    spec.variability()  # every part parses
    return spec


@dataclass(slots=True)
class Injector:
    """One rank's draws: :meth:`seconds` of an action in the current run; :meth:`next_run` after each run."""

    spec: InjectSpec
    device: int
    devices: int
    stages: int
    run: int = 0
    _variability: Variability = field(init=False)
    _factor: float = field(init=False, default=1.0)
    _uniform: object = field(init=False, default=None)
    _draw: object = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._variability = self.spec.variability()
        self._variability.check_devices(self.devices)
        self._start_run()

    def _start_run(self) -> None:
        """This run's draws, and this device's straggler factor in it: the draws of the simulator's sample number
        :attr:`run` (:func:`sim.engines.sampling.python_draws`)."""
        self._uniform, self._draw = sampling.python_draws(self.spec.seed, self.run)
        factor = 1.0
        for g, s in enumerate(self._variability.stragglers):
            if self._uniform(sampling.STREAM_STRAGGLER, 2 * g) < s.prob:
                d = s.device
                if d is None:
                    d = min(int(self._uniform(sampling.STREAM_STRAGGLER, 2 * g + 1) * self.devices), self.devices - 1)
                if d == self.device:
                    factor *= s.factor
        self._factor = factor

    def next_run(self) -> None:
        self.run += 1
        self._start_run()

    def seconds(self, base: float, stage: int, kind: int, mb: int) -> float:
        """How long action (*stage*, *kind* ordinal, *mb*) of planned *base* seconds waits in this run: the draw the
        simulator's sample number :attr:`run` gives the same action (its key, :mod:`sim.core.ir`)."""
        compute = self._variability.compute
        value = base
        if compute.active:
            key = encode_key(stage, kind, mb, self.stages)
            value = base * self._draw(sampling.DISTRIBUTION_CODES[compute.kind], compute.cv, sampling.STREAM_COMPUTE,
                                      key)
        return value * self._factor


class InjectedStage:
    """A real stage runtime whose every action computes for real, then waits until it has lasted its drawn duration:
    the baseline P of its kind (:func:`padded_costs`) times the action's factor (module docstring). Everything else
    (reset, logs, weights) is the wrapped runtime's; reset also moves the draws to the next run."""

    def __init__(self, inner, stage: int, padded: dict[str, float], inject: Injector, sleeper) -> None:
        self.inner, self.stage, self.padded, self.inject = inner, stage, dict(padded), inject
        self.real: dict[tuple[int, bool], list[float]] = {}
        """(kind ordinal, unsplit B) -> real computation seconds since the last :meth:`settle_padding`."""
        self.sleeper = sleeper
        """Waits precisely until a deadline: :class:`validate.rank.workloads.Sleeper` (given: workloads imports us)."""

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _hold(self, started: float, seconds: float, kind: int, mb: int, *, unsplit: bool = False) -> None:
        # the real computation's own time, by kind (an unsplit B apart: it holds W's work too), for settle_padding
        self.real.setdefault((kind, unsplit), []).append(time.perf_counter() - started)
        self.sleeper.until(started + self.inject.seconds(seconds, self.stage, kind, mb))

    def settle_padding(self) -> dict[str, float]:
        """After the warm-up: raise each kind's baseline to cover the longest real computation of that kind seen
        inside the schedule (ranks sharing cores compute slower there than alone), with the same headroom and
        low-factor margin as :func:`padded_costs`; the timed runs use these. Returns the baselines."""
        scale = PAD_HEADROOM / low_factor(self.inject.spec)
        for (kind, unsplit), seconds in sorted(self.real.items()):
            need = max(seconds) * scale
            if unsplit:  # an unsplit B lasts P(backward) + P(weight): both raised in proportion
                total = self.padded["backward"] + self.padded["weight"]
                if need > total > 0:
                    self.padded["backward"] *= need / total
                    self.padded["weight"] *= need / total
            else:
                column = PAD_COLUMNS[kind]
                self.padded[column] = max(self.padded[column], need)
        self.real.clear()
        return dict(self.padded)

    def forward(self, mb, x, *, keep_graph=True):
        t0 = time.perf_counter()
        out = self.inner.forward(mb, x, keep_graph=keep_graph)
        self._hold(t0, self.padded["forward"], OP_F, mb)
        return out

    def backward(self, mb, grad_out, *, split):
        t0 = time.perf_counter()
        out = self.inner.backward(mb, grad_out, split=split)
        # an unsplit B does the weight gradient too: the simulator's cost(B, split=False) = backward + weight
        base = self.padded["backward"] + (0.0 if split else self.padded["weight"])
        self._hold(t0, base, OP_B, mb, unsplit=not split)
        return out

    def weight(self, mb):
        t0 = time.perf_counter()
        self.inner.weight(mb)
        self._hold(t0, self.padded["weight"], OP_W, mb)

    def recompute(self, mb):
        t0 = time.perf_counter()
        self.inner.recompute(mb)
        self._hold(t0, self.padded["recompute"], OP_R, mb)

    def update(self, u):
        t0 = time.perf_counter()
        self.inner.update(u)
        self._hold(t0, self.padded["update"], OP_U, u)

    def reset(self) -> None:
        self.inner.reset()
        self.inject.next_run()  # a run ended: the next one draws its own stragglers


def attach_injectors(runtimes: dict, device: int, devices: int, spec: InjectSpec | None) -> None:
    """Give every emulated stage runtime of this rank (pipeline device *device* of *devices*) its injector when the
    run injects (*spec*, :attr:`validate.request.RunRequest.inject`); the hook of
    :func:`validate.rank.workloads.rank_setup`. Real stages are wrapped later (:func:`inject_real`), once their
    costs are measured."""
    if spec is None:
        return
    for runtime in runtimes.values():
        runtime.inject = Injector(spec, device, devices, runtime.costs.stages)


def inject_real(runtimes: dict, device: int, devices: int, stages: int, spec: InjectSpec,
                measured: dict[int, dict[str, float]], sleeper) -> tuple[dict, dict[int, dict[str, float]]]:
    """Real stage runtimes wrapped in :class:`InjectedStage` (one injector each, run 0 next), and the baselines P
    they pad to (stage -> column -> seconds, :func:`padded_costs` of *measured*, the stages' costs alone).
    *sleeper*: makes each stage's precise wait (:class:`validate.rank.workloads.Sleeper`)."""
    padded = padded_costs({s: measured[s] for s in runtimes}, spec)
    wrapped = {s: InjectedStage(rt, s, padded[s], Injector(spec, device, devices, stages), sleeper())
               for s, rt in runtimes.items()}
    return wrapped, padded
