"""Overlapped forward/backward pairs in a trace: how long the pair took against the sum of its parts. Needs no torch.

    pipesim ingest train.json --overlap-pairs --action-pattern '(?P<part>\\w+)\\((?P<kind>[FBW])\\)'

DualPipe (DeepSeek-V3 technical report, sec. 3.2.1, fig. 4) and PyTorch's ``ScheduleDualPipeV`` run a
forward chunk and a backward chunk of two micro-batches as one overlapped pair: the pieces of each
(attention, MoE dispatch, MLP, combine) alternate on the CPU and their kernels overlap on the GPU, one
chunk's all-to-all hiding behind the other's compute. pipesim models such a pair as one unit whose time
``--overlap-fb`` sets (seconds, or the share of F + B that overlapping saves; ``sim.engines.plan.OverlapFB``).
This module measures that share from a trace:

- the **parts** are the ranges whose names an ``--action-pattern`` matches (named group ``kind``: F, B,
  I or W, words as in :mod:`validate.ingest.actions`; optional ``part``, ``mb``), e.g. DeepSeek's
  profile-data ``train.json`` marks ``attn(F)``, ``dispatch(F)``, ``mlp(B)``, ``mlp(W)``, ...;
- a **pair** is the innermost range of the same thread that holds parts of both a forward and a
  backward (DeepSeek's ``1F1B`` range; ``PP:(0F3;3B1)OVERLAP_F_B`` in PyTorch's runtime);
- on GPUs each part's time is the busy time (union of intervals) of the kernels its CPU range launched
  (correlation ids, any stream), the pair's the span from its first kernel's start to its last kernel's
  end; without kernels, the CPU ranges' own durations;
- F = the sum over the forward parts, B = over the backward parts (B, I and W); the pair saves
  ``1 - pair / (F + B)``: what ``--overlap-fb`` should be (``--overlap-fb 30%``).

The parts' times are measured while overlapping, so F + B is what the parts take *sharing* the GPU:
the saving is a lower bound of what running them apart would cost (each alone could be faster).
Units: microseconds in the trace, seconds and milliseconds in the report.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.errors import PipesimError

from validate.ingest.actions import KIND_WORDS, compile_patterns
from validate.ingest.reader import Keep, Span, read_trace

__all__ = ["PairError", "Pair", "PairReport", "overlap_pairs"]

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class PairError(PipesimError):
    """No overlapped pair could be measured in the trace."""


@dataclass(frozen=True, slots=True)
class Pair:
    name: str
    """The enclosing range's name."""
    trace: str
    pair_s: float
    """Seconds: the pair's GPU span (or CPU range)."""
    forward_s: float
    """Sum of the forward parts' times."""
    backward_s: float
    """Sum of the backward parts' (B, I, W) times."""
    parts: dict = field(default_factory=dict)
    """part name -> seconds (summed over its occurrences)."""
    on_gpu: bool = True

    @property
    def saved(self) -> float:
        total = self.forward_s + self.backward_s
        return 1.0 - self.pair_s / total if total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class PairReport:
    pairs: list[Pair]

    def to_dict(self) -> dict:
        return {"pairs": [{"range": p.name, "trace": p.trace, "pair_s": p.pair_s, "forward_s": p.forward_s,
                           "backward_s": p.backward_s, "saved": p.saved, "on_gpu": p.on_gpu, "parts_s": p.parts}
                          for p in self.pairs],
                "overlap_fb": self.overlap_fb}

    @property
    def overlap_fb(self) -> str:
        """The ``--overlap-fb`` value the pairs measure (median share saved)."""
        saved = sorted(p.saved for p in self.pairs)
        return f"{max(0.0, saved[len(saved) // 2]) * 100:.0f}%"

    def lines(self) -> list[str]:
        out = []
        for p in self.pairs:
            where = "GPU kernels" if p.on_gpu else "CPU ranges (no kernels in the trace)"
            out.append(f"pair {p.name!r} ({p.trace}): {p.pair_s * 1e3:.3f} ms overlapped against F "
                       f"{p.forward_s * 1e3:.3f} ms + B {p.backward_s * 1e3:.3f} ms = "
                       f"{(p.forward_s + p.backward_s) * 1e3:.3f} ms apart: saves {p.saved:.1%} ({where})")
            out.append("  parts: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(p.parts.items())))
        out.append(f"set --overlap-fb {self.overlap_fb} (pipesim simulate -s dualpipev ...) for pairs like these")
        return out


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def overlap_pairs(paths: Sequence[str], patterns: Sequence[str]) -> PairReport:
    """Every overlapped pair in the traces at *paths* (module docstring); :class:`PairError` when there is none."""
    rxs = compile_patterns(patterns, groups=("kind",))  # a pair's halves: no micro-batch
    pairs: list[Pair] = []
    for path in paths:
        trace = read_trace(path, keep=Keep(patterns=tuple(rxs), annotations=True))
        pairs += _pairs_of(trace.spans, rxs, str(path))
    if not pairs:
        raise PairError("no overlapped pair found: no range holds parts of both a forward and a backward that "
                        "--action-pattern matches (check the pattern against the trace's range names)")
    return PairReport(pairs)


def _kind(name: str, rxs: list[re.Pattern]) -> tuple[str, str] | None:
    for rx in rxs:
        m = rx.fullmatch(name)
        if m and m["kind"] and (kind := KIND_WORDS.get(m["kind"].lower())) in ("F", "B", "I", "W"):
            part = m.groupdict().get("part") or name
            return kind, part
    return None


def _pairs_of(spans: Sequence[Span], rxs: list[re.Pattern], label: str) -> list[Pair]:
    parts = [(s, k) for s in spans if s.cat not in _DEVICE_CATS and s.cat != "gpu_user_annotation"
             and (k := _kind(s.name, rxs)) is not None]
    if not parts:
        return []
    kernels: dict[object, list[Span]] = defaultdict(list)
    launches: dict[object, list[Span]] = defaultdict(list)  # pid -> launches sorted by start
    for s in spans:
        corr = s.args.get("correlation")
        if corr is None:
            continue
        if s.cat in _DEVICE_CATS:
            kernels[corr].append(s)
        elif s.cat in ("cuda_runtime", "cuda_driver"):
            launches[s.pid].append(s)
    on_gpu = bool(kernels)

    def gpu(span: Span) -> list[tuple[float, float]]:
        return [(k.start, k.end) for ln in launches.get(span.pid, ()) if span.start <= ln.start <= span.end
                for k in kernels.get(ln.args["correlation"], ())]

    part_ids = {id(s) for s, _ in parts}
    candidates = [s for s in spans if id(s) not in part_ids and s.cat not in _DEVICE_CATS
                  and s.cat != "gpu_user_annotation" and not s.name.startswith("ProfilerStep#")]
    found = []
    for r in candidates:  # the innermost ranges holding both a forward and a backward part
        inside = [(s, k) for s, k in parts if s.thread == r.thread and r.start <= s.start and s.end <= r.end]
        kinds = {k[0] for _, k in inside}
        if "F" in kinds and kinds & {"B", "I", "W"}:
            found.append((r, inside))
    inner = [(r, inside) for r, inside in found
             if not any(o is not r and r.start <= o.start and o.end <= r.end and (o.start, o.end) != (r.start, r.end)
                        for o, _ in found)]
    out = []
    for r, inside in inner:
        times: dict[str, float] = defaultdict(float)
        f = b = 0.0
        for s, (kind, part) in inside:
            t = _union(gpu(s)) if on_gpu else s.end - s.start
            times[part] += t * 1e-6
            if kind == "F":
                f += t
            else:
                b += t
        all_k = gpu(r) if on_gpu else []
        pair = (max(e for _, e in all_k) - min(a for a, _ in all_k)) if all_k else r.end - r.start
        out.append(Pair(name=r.name, trace=label, pair_s=pair * 1e-6, forward_s=f * 1e-6, backward_s=b * 1e-6,
                        parts=dict(times), on_gpu=on_gpu and bool(all_k)))
    return out
