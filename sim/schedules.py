"""Schedule generators as plain functions: ``schedules.gpipe(4, 8, recompute=True)``.

Each function builds a :class:`~sim.config.PipelineConfig`, calls the registered
generator, applies the lowering passes (recompute) and validates the result.
"""

from __future__ import annotations

from .config import ConfigError, PipelineConfig
from .generators import get_generator, names
from .ir import Schedule
from .passes import lower

__all__ = ["generate", "naive", "gpipe", "one_f_one_b", "pipedream", "names"]


def generate(name: str, devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False,
             chunks: int = 1) -> Schedule:
    """The validated schedule registered as *name* for K devices and M micro-batches."""
    generator = get_generator(name)
    supported = getattr(generator, "CHUNKS", 1)  # model chunks per device it runs: an int, or None for any
    if supported is not None and chunks != supported:
        if supported == 1:
            raise ConfigError(f"schedule {name!r} places one stage per device; it takes no --chunks (got {chunks})")
        raise ConfigError(f"schedule {name!r} needs --chunks {supported} (got {chunks})")
    cfg = PipelineConfig(devices=devices, microbatches=microbatches, iterations=iterations,
                         recompute=recompute, chunks=chunks)
    return lower(generator.generate(cfg), recompute=recompute)


def naive(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("naive", devices, microbatches, iterations=iterations, recompute=recompute)


def gpipe(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("gpipe", devices, microbatches, iterations=iterations, recompute=recompute)


def one_f_one_b(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("1f1b", devices, microbatches, iterations=iterations, recompute=recompute)


def pipedream(devices: int, microbatches: int, *, iterations: int = 1, recompute: bool = False) -> Schedule:
    return generate("pipedream", devices, microbatches, iterations=iterations, recompute=recompute)
