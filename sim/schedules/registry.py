"""The schedule registry: CLI name -> generator module.

Every generator lives in its own module with the same surface: ``generate(cfg:
PipelineConfig) -> Schedule`` plus the strings NAME, SUMMARY, SOURCE, BUBBLE and
MEMORY that ``pipesim schedules`` prints, and optionally CHUNKS: the model chunks
per device it places (1 by default; 0 if it takes any ``--chunks``, then DEFAULT_CHUNKS is
what it runs without one). Adding a schedule means adding a module
and a line here; the engine never changes.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

__all__ = ["REGISTRY", "get_generator", "names", "default_chunks"]

# CLI name -> module under sim.schedules.registry
REGISTRY: dict[str, str] = {
    "naive": "naive",
    "gpipe": "gpipe",
    "1f1b": "one_f_one_b",
    "pipedream": "pipedream",
    "interleaved-1f1b": "interleaved_1f1b",
    "zb-h1": "zb_h1",
    "zb-h2": "zb_h2",
    "zbv": "zbv",
    "dualpipev": "dualpipev",
    "pipedream-2bw": "pipedream_2bw",
}


def names() -> list[str]:
    return list(REGISTRY)


def get_generator(name: str) -> ModuleType:
    """The generator module registered as *name*; a miss lists the valid names."""
    try:
        module = REGISTRY[name]
    except KeyError:
        from sim.core.ir import ScheduleError  # here: keeps the registry's imports as they are
        raise ScheduleError(f"unknown schedule {name!r}; choose one of: {', '.join(REGISTRY)}") from None
    return import_module(f"sim.schedules.generators.{module}")


def default_chunks(name: str) -> int:
    """Model chunks per device that schedule *name* runs when no ``--chunks`` is given.

    Fixed-chunk schedules run their own (2 for the V-shaped ones); a schedule that takes any
    number runs its DEFAULT_CHUNKS (interleaved 1F1B: 2, Megatron's smallest interleaving,
    so that ``-s interleaved-1f1b`` never silently runs as plain 1F1B).
    """
    generator = get_generator(name)
    fixed = getattr(generator, "CHUNKS", 1)
    return fixed or getattr(generator, "DEFAULT_CHUNKS", 1)
