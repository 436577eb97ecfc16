"""What a schedule generator is asked for: devices, micro-batches, iterations and options."""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import PipesimError

__all__ = ["PipelineConfig", "ConfigError"]


class ConfigError(PipesimError):
    """A pipeline configuration no generator can honour."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineConfig:
    devices: int
    """K, pipeline devices (ranks)."""
    microbatches: int
    """M, micro-batches per iteration (per optimizer step for flush schedules)."""
    iterations: int = 1
    """How many iterations to lay out back to back."""
    recompute: bool = False
    """Re-materialize: keep only each stage's input after F, re-run the forward (R) before B."""
    chunks: int = 1
    """Model chunks (virtual stages) per device; interleaved and V-shaped schedules use more than one."""

    def __post_init__(self) -> None:
        for name in ("devices", "microbatches", "iterations", "chunks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        # a string such as "yes" is truthy: taken as is it would reach the generators and fail far from the cause
        if type(self.recompute).__name__ not in ("bool", "bool_"):
            raise ConfigError(f"recompute must be True or False, got {self.recompute!r}")

    @property
    def stages(self) -> int:
        return self.devices * self.chunks
