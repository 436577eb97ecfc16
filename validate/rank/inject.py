"""Injected variability for measured runs: the emulated workload waits for durations drawn from the same
distributions, with the same random numbers, as the simulator's Monte Carlo (:mod:`sim.engines.sampling`).

``pipesim validate --inject SPEC`` (SPEC as ``simulate --samples``: ``lognormal:0.1``, ``normal:0.05``,
``straggler=device=2,factor=1.5,prob=0.2``, separated by ``;``) makes every emulated action wait for its cost times
a random factor, and a straggling device wait ``factor`` times as long in the runs where it strikes. Run *r* of a
rank uses the draws of Monte Carlo sample *r* of the same seed, keyed by the action, so all ranks agree on which
device straggles in which run without talking to each other.

The specification reaches the ranks through the environment (:data:`ENVIRONMENT`, JSON), which every launch
(one-machine processes, torchrun, in-process threads) passes on unchanged. Transfers and pauses are not injected:
transfers are real (gloo, NCCL), so ``--link-variability``, ``--slow-link`` and ``--pause`` are refused here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from sim.core.ir import encode_key
from sim.engines import sampling
from sim.engines.variability import Distribution, Straggler, Variability, VariabilityError

__all__ = ["InjectSpec", "Injector", "ENVIRONMENT", "parse_inject", "attach_injectors", "environment_spec"]

ENVIRONMENT = "PIPESIM_INJECT"
"""Environment variable holding the JSON of the :class:`InjectSpec` of the current validation run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectSpec:
    """What a measured run injects: a per-action distribution and stragglers, and the seed of the draws."""

    compute: str = "none"
    """``lognormal:CV``, ``normal:CV`` or ``none``."""
    stragglers: tuple[str, ...] = ()
    """``device=N|any,factor=F[,prob=P]`` each."""
    seed: int = 0

    def variability(self) -> Variability:
        """The same specification for the Monte Carlo prediction."""
        return Variability.parse(None if self.compute == "none" else self.compute, stragglers=self.stragglers)

    def to_json(self) -> str:
        return json.dumps({"compute": self.compute, "stragglers": list(self.stragglers), "seed": self.seed})

    @classmethod
    def from_json(cls, text: str) -> InjectSpec:
        data = json.loads(text)
        return cls(compute=data["compute"], stragglers=tuple(data["stragglers"]), seed=int(data["seed"]))

    def describe(self) -> str:
        return ";".join([self.compute] + [f"straggler={s}" for s in self.stragglers])


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


def environment_spec() -> InjectSpec | None:
    """The :class:`InjectSpec` this process was launched with (:data:`ENVIRONMENT`), or None."""
    text = os.environ.get(ENVIRONMENT)
    return InjectSpec.from_json(text) if text else None


def attach_injectors(runtimes: dict, device: int, devices: int) -> None:
    """Give every emulated stage runtime of this rank (pipeline device *device* of *devices*) its injector, when the
    run injects (:data:`ENVIRONMENT`); the hook of :func:`validate.rank.workloads.rank_setup`."""
    spec = environment_spec()
    if spec is None:
        return
    for runtime in runtimes.values():
        runtime.inject = Injector(spec, device, devices, runtime.costs.stages)
