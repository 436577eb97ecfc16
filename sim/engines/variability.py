"""What varies from one run of a schedule to the next: the inputs of a Monte Carlo run (:mod:`sim.engines.sampling`).

A :class:`Variability` combines independent sources, each optional:

- ``compute``: every computation's duration drawn per action (:class:`Distribution`): times a lognormal factor of
  mean 1 and coefficient of variation CV (``lognormal:0.1``), times a normal factor of mean 1 truncated at 0
  (``normal:0.1``), or resampled from the durations a measured timeline holds for the same (stage, kind)
  (``empirical:FILE``: a validator run's ``--timeline`` CSV, an ingested trace's timeline);
- ``links``: every transfer's seconds times a lognormal or normal factor, the same way (network jitter);
- ``stragglers``: a device whose computations all take *factor* times as long, in a share *prob* of the samples
  (:class:`Straggler`: ``device=2,factor=1.5,prob=0.1``; ``device=any`` picks a device at random per sample);
- ``slow_links``: a directed link whose transfers take *factor* times as long, in a share *prob* of the samples
  (:class:`SlowLink`: ``src=0,dst=1,factor=3,prob=0.2``);
- ``pause``: periodic pauses of the devices (:class:`Pause`: ``every=0.5s,length=20ms``: garbage collection,
  checkpoint writes): a computation that runs into a pause is suspended for its length.

Why these: PRISM (arXiv 2510.15596, section 3) measures per-kernel GPU time spreads of up to 14 % and models them as
per-operation random factors; the OSDI'25 straggler study (Lin et al., "Understanding Stragglers in Large Model
Training Using What-if Analysis", section 4) finds most slow steps caused by one slow worker or by pauses such as
garbage collection; PipeMorph (NSDI'26, section 2) injects link jitter. Every string form parses with one clear
line on a mistake (:class:`VariabilityError`, exit code 2 on the command line).

Units: seconds, and factors (dimensionless).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from sim.errors import PipesimError, quote

__all__ = ["Variability", "Distribution", "Straggler", "SlowLink", "Pause", "VariabilityError", "load_empirical",
           "parse_seconds", "MAX_CV", "EMPIRICAL_KINDS"]

MAX_CV = 10.0
"""Largest coefficient of variation accepted: far past any measured spread (PRISM: 0.09 to 0.14), and where a
truncated normal still keeps more than half of its draws (Phi(1/10) = 0.54), so sampling it stays cheap."""

EMPIRICAL_KINDS = ("F", "B", "W", "R", "U")
"""The computation kinds a measured timeline's durations are pooled by (the codec's order, :mod:`sim.core.ir`)."""


class VariabilityError(PipesimError):
    """A variability, straggler, slow-link or pause specification pipesim cannot use."""


def _number(text: str, what: str, *, low: float = 0.0, low_open: bool = False, high: float = math.inf) -> float:
    try:
        value = float(text)
    except ValueError:
        raise VariabilityError(f"{what} must be a number, got {quote(text)}") from None
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise VariabilityError(f"{what} must be a finite number {bound}"
                               + (f" and <= {high:g}" if high < math.inf else "") + f", got {quote(text)}")
    return value


_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}


def parse_seconds(text: str, what: str) -> float:
    """``0.5s``, ``20ms``, ``300us``, ``1min`` or a bare number of seconds, > 0."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(s|ms|us|min)?\s*", text)
    if not match:
        raise VariabilityError(f"{what} must be a time such as 0.5s, 20ms or 300us, got {quote(text)}")
    value = _number(match.group(1), what, low_open=True)
    return value * _UNITS[match.group(2) or "s"]


def _fields(text: str, what: str, allowed: tuple[str, ...], required: tuple[str, ...],
            flags: tuple[str, ...] = ()) -> dict[str, str]:
    """``key=value,key=value`` -> dict, every key known and none given twice; *flags* may appear without a value."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep and key in flags:
            value = "true"
        elif not sep or key not in allowed:
            raise VariabilityError(f"{what} takes {','.join(k + '=...' for k in allowed if k not in flags)}"
                                   + (f" (and {', '.join(flags)})" if flags else "") + f"; got {quote(part)}")
        if key in out:
            raise VariabilityError(f"{what}: {key} given twice in {quote(text)}")
        out[key] = value.strip()
    missing = [k for k in required if k not in out]
    if missing:
        raise VariabilityError(f"{what} needs {', '.join(k + '=...' for k in missing)}; got {quote(text)}")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Distribution:
    """How one duration varies: ``none``, ``lognormal`` or ``normal`` with coefficient of variation *cv*, or
    ``empirical`` resampling of measured durations (*pools*)."""

    kind: str = "none"
    """'none', 'lognormal', 'normal' or 'empirical'."""
    cv: float = 0.0
    """Coefficient of variation (std / mean) of the factor, lognormal and normal only."""
    pools: Mapping[tuple[int, str], np.ndarray] = field(default_factory=dict, compare=False)
    """Empirical only: (stage, kind letter) -> measured seconds of that stage's computations of that kind."""
    source: str = ""
    """Where the pools come from (the file), for reports."""

    KINDS = ("none", "lognormal", "normal", "empirical")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise VariabilityError(f"unknown distribution {quote(self.kind)}; choose one of {', '.join(self.KINDS)}")
        if not (isinstance(self.cv, (int, float)) and 0 <= self.cv <= MAX_CV):
            raise VariabilityError(f"a coefficient of variation must be in [0, {MAX_CV:g}], got {quote(self.cv)}")
        if self.kind == "empirical" and not self.pools:
            raise VariabilityError("an empirical distribution needs measured durations; none were given")

    @classmethod
    def parse(cls, text: str, *, what: str = "--variability") -> Distribution:
        """``lognormal:0.1``, ``normal:0.05``, ``empirical:FILE`` or ``none``."""
        name, sep, arg = text.strip().partition(":")
        name = name.strip().lower()
        if name == "none" and not sep:
            return cls()
        if name in ("lognormal", "normal") and sep:
            return cls(kind=name, cv=_number(arg, f"{what} {name}'s coefficient of variation", high=MAX_CV))
        if name == "empirical" and sep and arg.strip():
            return load_empirical(arg.strip())
        raise VariabilityError(f"{what} takes lognormal:CV, normal:CV or empirical:FILE (a measured timeline CSV); "
                               f"got {quote(text)}")

    @property
    def active(self) -> bool:
        return self.kind == "empirical" or (self.kind != "none" and self.cv > 0)

    def describe(self) -> str:
        if self.kind == "empirical":
            return f"empirical:{self.source}"
        return "none" if not self.active else f"{self.kind}:{self.cv:g}"


def load_empirical(path: str) -> Distribution:
    """The measured durations of a timeline file (CSV or Parquet, the schema of :mod:`sim.results.timeline`), pooled
    by (stage, kind): what ``empirical:FILE`` resamples."""
    import pandas as pd  # only when a file is read: `import sim` stays light

    from sim.files import read_text

    try:
        if str(path).lower().endswith(".parquet"):
            frame = pd.read_parquet(path)
        else:
            import io

            frame = pd.read_csv(io.StringIO(read_text(path, what="empirical timeline", error=VariabilityError)))
    except VariabilityError:
        raise
    except (OSError, ValueError) as exc:
        raise VariabilityError(f"cannot read the empirical timeline {quote(str(path), 200)}: "
                               f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    missing = [c for c in ("stage", "op", "start", "end") if c not in frame.columns]
    if missing:
        raise VariabilityError(f"the empirical timeline {quote(str(path), 200)} lacks the column(s) "
                               f"{', '.join(missing)}; give a timeline written by `pipesim simulate --timeline`, "
                               f"`pipesim validate` or `pipesim ingest`")
    rows = frame[frame["op"].astype(str).isin(EMPIRICAL_KINDS)]
    seconds = (pd.to_numeric(rows["end"], errors="coerce") - pd.to_numeric(rows["start"], errors="coerce")).to_numpy()
    stages = pd.to_numeric(rows["stage"], errors="coerce").to_numpy()
    ok = np.isfinite(seconds) & (seconds >= 0) & np.isfinite(stages) & (stages >= 0)
    if not ok.any():
        raise VariabilityError(f"the empirical timeline {quote(str(path), 200)} holds no computation with a "
                               f"finite duration >= 0 (ops {', '.join(EMPIRICAL_KINDS)})")
    ops = rows["op"].astype(str).to_numpy()[ok]
    pools: dict[tuple[int, str], list[float]] = {}
    for stage, op, s in zip(stages[ok].astype(np.int64).tolist(), ops.tolist(), seconds[ok].tolist()):
        pools.setdefault((stage, op), []).append(s)
    return Distribution(kind="empirical", pools={k: np.asarray(v) for k, v in sorted(pools.items())},
                        source=str(path))


def _probability(text: str, what: str) -> float:
    return _number(text, what, high=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """A slow device: in a share *prob* of the samples, every computation of *device* takes *factor* times as
    long (the whole step: a thermally throttled GPU, a noisy neighbour)."""

    device: int | None
    """The slow device; None: one device drawn uniformly at random in each sample where it strikes."""
    factor: float
    """How many times as long its computations take (> 0; 1.5: 50 % slower)."""
    prob: float = 1.0
    """Share of samples in which it is slow, in [0, 1]."""

    def __post_init__(self) -> None:
        if self.device is not None and (isinstance(self.device, bool) or not isinstance(self.device, int)
                                        or self.device < 0):
            raise VariabilityError(f"a straggler's device must be an integer >= 0 or None (any), got "
                                   f"{quote(self.device)}")
        if not (isinstance(self.factor, (int, float)) and 0 < self.factor < math.inf):
            raise VariabilityError(f"a straggler's factor must be a finite number > 0, got {quote(self.factor)}")
        if not (isinstance(self.prob, (int, float)) and 0 <= self.prob <= 1):
            raise VariabilityError(f"a straggler's prob must be in [0, 1], got {quote(self.prob)}")

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """``device=2,factor=1.5[,prob=0.1]``; ``device=any`` draws the device per sample."""
        f = _fields(text, "--straggler", ("device", "factor", "prob"), ("device", "factor"))
        if f["device"].lower() in ("any", "random"):
            device = None
        else:
            try:
                device = int(f["device"])
            except ValueError:
                raise VariabilityError(f"--straggler device must be a device number or 'any', got "
                                       f"{quote(f['device'])}") from None
        return cls(device=device, factor=_number(f["factor"], "--straggler factor", low_open=True),
                   prob=_probability(f.get("prob", "1"), "--straggler prob"))

    def describe(self) -> str:
        return f"device={'any' if self.device is None else self.device},factor={self.factor:g},prob={self.prob:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowLink:
    """A slow directed link: in a share *prob* of the samples, every transfer from *src* to *dst* takes *factor*
    times as long (a congested switch port, a link that fell back to a slower lane width)."""

    src: int
    dst: int
    factor: float
    prob: float = 1.0

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise VariabilityError(f"a slow link's {name} must be a device number >= 0, got {quote(value)}")
        if self.src == self.dst:
            raise VariabilityError(f"a slow link joins two different devices, got src = dst = {self.src}")
        if not (isinstance(self.factor, (int, float)) and 0 < self.factor < math.inf):
            raise VariabilityError(f"a slow link's factor must be a finite number > 0, got {quote(self.factor)}")
        if not (isinstance(self.prob, (int, float)) and 0 <= self.prob <= 1):
            raise VariabilityError(f"a slow link's prob must be in [0, 1], got {quote(self.prob)}")

    @classmethod
    def parse(cls, text: str) -> SlowLink:
        """``src=0,dst=1,factor=3[,prob=0.2]``."""
        f = _fields(text, "--slow-link", ("src", "dst", "factor", "prob"), ("src", "dst", "factor"))
        ends = {}
        for name in ("src", "dst"):
            try:
                ends[name] = int(f[name])
            except ValueError:
                raise VariabilityError(f"--slow-link {name} must be a device number, got {quote(f[name])}") from None
        return cls(**ends, factor=_number(f["factor"], "--slow-link factor", low_open=True),
                   prob=_probability(f.get("prob", "1"), "--slow-link prob"))

    def describe(self) -> str:
        return f"src={self.src},dst={self.dst},factor={self.factor:g},prob={self.prob:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """Periodic pauses: every *every* seconds a device stops computing for *length* seconds (garbage collection,
    checkpoint writes, the OSDI'25 straggler study's section 4.3). A computation that runs into a pause is suspended
    and resumes after it; transfers go on. Each device's pauses start at a random phase per sample unless
    *aligned* (all devices pause together, e.g. a synchronous checkpoint)."""

    every: float
    """Period, seconds (> length)."""
    length: float
    """Seconds each pause lasts (> 0)."""
    device: int | None = None
    """The device that pauses; None: all of them."""
    aligned: bool = False
    """All paused devices pause at the same times, from t = 0 (else a random phase per device and sample)."""

    def __post_init__(self) -> None:
        for name in ("every", "length"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise VariabilityError(f"a pause's {name} must be a finite number of seconds > 0, got {quote(value)}")
        if self.length >= self.every:
            raise VariabilityError(f"a pause of {self.length:g} s every {self.every:g} s never lets a device work; "
                                   f"give length < every")
        if self.device is not None and (isinstance(self.device, bool) or not isinstance(self.device, int)
                                        or self.device < 0):
            raise VariabilityError(f"a pause's device must be a device number >= 0 or None (all), got "
                                   f"{quote(self.device)}")

    @classmethod
    def parse(cls, text: str) -> Pause:
        """``every=0.5s,length=20ms[,device=N|all][,aligned]``."""
        f = _fields(text, "--pause", ("every", "length", "device", "aligned"), ("every", "length"),
                    flags=("aligned",))
        device = f.get("device", "all")
        if device.lower() == "all":
            number = None
        else:
            try:
                number = int(device)
            except ValueError:
                raise VariabilityError(f"--pause device must be a device number or 'all', got {quote(device)}") \
                    from None
        aligned = f.get("aligned", "false").lower()
        if aligned not in ("true", "false", "1", "0", "yes", "no"):
            raise VariabilityError(f"--pause aligned takes no value (or true/false), got {quote(aligned)}")
        return cls(every=parse_seconds(f["every"], "--pause every"),
                   length=parse_seconds(f["length"], "--pause length"), device=number,
                   aligned=aligned in ("true", "1", "yes"))

    def describe(self) -> str:
        return (f"every={self.every:g}s,length={self.length:g}s,device={'all' if self.device is None else self.device}"
                + (",aligned" if self.aligned else ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class Variability:
    """Every source of variation of a Monte Carlo run (module docstring); the default varies nothing."""

    compute: Distribution = field(default_factory=Distribution)
    """Per computation."""
    links: Distribution = field(default_factory=Distribution)
    """Per transfer (lognormal or normal)."""
    stragglers: tuple[Straggler, ...] = ()
    slow_links: tuple[SlowLink, ...] = ()
    pause: Pause | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.compute, Distribution) or not isinstance(self.links, Distribution):
            raise VariabilityError("compute and links must be sim.engines.variability.Distribution objects "
                                   "(e.g. Distribution.parse('lognormal:0.1'))")
        if self.links.kind == "empirical":
            raise VariabilityError("links take lognormal:CV or normal:CV; empirical resampling is for computations")
        object.__setattr__(self, "stragglers", tuple(self.stragglers))
        object.__setattr__(self, "slow_links", tuple(self.slow_links))
        for s, cls in [(s, Straggler) for s in self.stragglers] + [(s, SlowLink) for s in self.slow_links]:
            if not isinstance(s, cls):
                raise VariabilityError(f"expected a {cls.__name__}, got {type(s).__name__} {quote(s)}")
        if self.pause is not None and not isinstance(self.pause, Pause):
            raise VariabilityError(f"pause must be a Pause or None, got {type(self.pause).__name__}")

    @classmethod
    def parse(cls, compute: str | None = None, *, links: str | None = None, stragglers: Iterable[str] = (),
              slow_links: Iterable[str] = (), pause: str | None = None) -> Variability:
        """From the command line's strings (module docstring)."""
        return cls(compute=Distribution.parse(compute) if compute else Distribution(),
                   links=Distribution.parse(links, what="--link-variability") if links else Distribution(),
                   stragglers=tuple(Straggler.parse(s) for s in stragglers),
                   slow_links=tuple(SlowLink.parse(s) for s in slow_links),
                   pause=Pause.parse(pause) if pause else None)

    @property
    def active(self) -> bool:
        """Whether anything varies (else every sample is the deterministic run)."""
        return (self.compute.active or self.links.active or self.pause is not None
                or any(s.prob > 0 and s.factor != 1 for s in self.stragglers)
                or any(s.prob > 0 and s.factor != 1 for s in self.slow_links))

    def describe(self) -> dict:
        """A JSON-ready description (what a report or a sweep row records)."""
        return {"compute": self.compute.describe(), "links": self.links.describe(),
                "stragglers": [s.describe() for s in self.stragglers],
                "slow_links": [s.describe() for s in self.slow_links],
                "pause": self.pause.describe() if self.pause else None}

    def check_devices(self, devices: int) -> None:
        """Refuse device numbers a schedule of *devices* devices does not have."""
        for s in self.stragglers:
            if s.device is not None and s.device >= devices:
                raise VariabilityError(f"--straggler device={s.device}, but the schedule has devices 0..{devices - 1}")
        for s in self.slow_links:
            if max(s.src, s.dst) >= devices:
                raise VariabilityError(f"--slow-link src={s.src},dst={s.dst}, but the schedule has devices "
                                       f"0..{devices - 1}")
        if self.pause is not None and self.pause.device is not None and self.pause.device >= devices:
            raise VariabilityError(f"--pause device={self.pause.device}, but the schedule has devices "
                                   f"0..{devices - 1}")
