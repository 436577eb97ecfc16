"""Schedule generators as plain functions: ``schedules.gpipe(4, 8, recompute=True)``.

Each function builds a :class:`~sim.core.config.PipelineConfig`, calls the registered
generator, applies the lowering passes (recompute) and validates the result.
"""

from __future__ import annotations

from sim.core.config import ConfigError, PipelineConfig
from sim.schedules.registry import default_chunks, get_generator, names
from sim.core.ir import Schedule
from sim.limits import check_fits
from sim.core.passes import lower

__all__ = ["generate", "naive", "gpipe", "one_f_one_b", "pipedream", "names", "interleaved_1f1b", "zb_h1", "zb_h2",
           "zbv", "dualpipev", "pipedream_2bw"]


def generate(name: str, devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False,
             chunks: int | None = None) -> Schedule:
    """The validated schedule registered as *name* for K devices and M micro-batches.

    *chunks*: model chunks per device; None takes the schedule's own (2 for V-shaped schedules and
    interleaved 1F1B, else 1).
    """
    generator = get_generator(name)
    supported = getattr(generator, "CHUNKS", 1)  # model chunks per device it runs: an int, or 0 / None for any
    if chunks is None:
        chunks = default_chunks(name)
    if supported and chunks != supported:
        if supported == 1:
            raise ConfigError(f"schedule {name!r} places one stage per device; it takes no --chunks (got {chunks})")
        raise ConfigError(f"schedule {name!r} needs --chunks {supported} (got {chunks})")
    cfg = PipelineConfig(devices=devices, microbatches=microbatches, iterations=iterations,
                         recompute=recompute, chunks=chunks)
    # at most F, B, W (or U per micro-batch) and R per (stage, micro-batch): refuse what cannot fit, before any work
    check_fits(devices * chunks * microbatches * iterations * (3 + recompute),
               f"{name} with K={devices}, M={microbatches}, iterations={iterations}, chunks={chunks}")
    return lower(generator.generate(cfg), recompute=recompute)


def naive(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("naive", devices, microbatches, iterations=iterations, recompute=recompute)


def gpipe(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("gpipe", devices, microbatches, iterations=iterations, recompute=recompute)


def one_f_one_b(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("1f1b", devices, microbatches, iterations=iterations, recompute=recompute)


def pipedream(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("pipedream", devices, microbatches, iterations=iterations, recompute=recompute)


def interleaved_1f1b(devices: int, microbatches: int, *, chunks: int = 2, iterations: int = 1,
                     recompute: bool = False) -> Schedule:
    """Megatron's interleaved 1F1B with *chunks* model chunks per device (M must be a multiple of K)."""
    return generate("interleaved-1f1b", devices, microbatches, iterations=iterations, recompute=recompute,
                    chunks=chunks)


def zb_h1(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("zb-h1", devices, microbatches, iterations=iterations, recompute=recompute)


def zb_h2(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("zb-h2", devices, microbatches, iterations=iterations, recompute=recompute)


def zbv(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    """ZB-V: two chunks per device in a V (stage s on device s and 2K-1-s)."""
    return generate("zbv", devices, microbatches, iterations=iterations, recompute=recompute, chunks=2)


def dualpipev(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    """DualPipeV: two chunks per device in a V; needs M >= 2K."""
    return generate("dualpipev", devices, microbatches, iterations=iterations, recompute=recompute, chunks=2)


def pipedream_2bw(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    """PipeDream-2BW: one update per batch of M micro-batches, two weight versions; needs M >= K."""
    return generate("pipedream-2bw", devices, microbatches, iterations=iterations, recompute=recompute)
