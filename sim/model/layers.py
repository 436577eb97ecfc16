"""Per-layer costs: the input of the partitioners (:mod:`sim.model.partition`).

A model is L consecutive layers. For each layer (units: seconds per micro-batch, bytes):

==================  ===========================================================================
column              meaning
==================  ===========================================================================
layer               the layer's name (any text without commas), in model order
forward             forward time of one micro-batch through the layer, seconds
backward            backward time (input and weight gradients together), seconds
activation_bytes    bytes of the layer's output for one micro-batch: what is sent to the next
                    stage when a stage boundary follows this layer, and what the layer keeps
                    for its backward
parameter_bytes     bytes of the layer's parameters (its gradient has the same size)
==================  ===========================================================================

The layers file is a CSV with exactly this header (``#`` lines are comments)::

    layer,forward,backward,activation_bytes,parameter_bytes
    embed,0.002,0.004,4194304,65536000
    block0,0.010,0.020,4194304,50331648

Such a table can be written by hand or measured from a real ``torch.nn.Sequential``
with :func:`validate.predict.profile_layers.profile_sequential` (this module never imports torch).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.errors import PipesimError, PipesimTypeError, quote, real_number
from sim.files import read_csv_rows, write_text

__all__ = ["LayerCosts", "LayersError", "LAYER_COLUMNS", "load_layers", "save_layers"]

LAYER_COLUMNS = ("layer", "forward", "backward", "activation_bytes", "parameter_bytes")


class LayersError(PipesimError):
    """Per-layer costs that cannot be used: a malformed file, negative or non-numeric values."""


def _numbers(values, n: int, name: str) -> tuple[float, ...]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise PipesimTypeError(f"{name} must be a sequence of numbers, one per layer; got {type(values).__name__} "
                               f"{quote(values)}")
    values = tuple(values)
    if len(values) != n:
        raise LayersError(f"{name} has {len(values)} entries but there are {n} layers; give one value per layer")
    out = []
    for i, v in enumerate(values):
        x = real_number(v, f"{name}[{i}]")  # numpy, Decimal and Fraction welcome; strings and bools are not
        if not math.isfinite(x) or x < 0:
            raise LayersError(f"{name}[{i}] = {quote(v)}; it must be a finite number >= 0")
        out.append(x)
    if not math.isfinite(sum(out)):  # the partitioners add layers up: a sum past the largest float is no answer
        raise LayersError(f"{name} adds up past the largest float; give the values in a larger unit")
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCosts:
    """Costs of L consecutive layers; each field has one entry per layer, in model order."""

    forward: tuple[float, ...]
    """Forward seconds per micro-batch."""
    backward: tuple[float, ...]
    """Backward seconds per micro-batch (input plus weight gradient)."""
    activation_bytes: tuple[float, ...] | None = None
    """Output bytes per micro-batch (default 0)."""
    parameter_bytes: tuple[float, ...] | None = None
    """Parameter bytes (default 0)."""
    names: tuple[str, ...] | None = None
    """Layer names (default layer0, layer1, ...)."""

    def __post_init__(self) -> None:
        if isinstance(self.forward, (str, bytes, dict)) or not hasattr(self.forward, "__len__"):
            raise PipesimTypeError(f"forward must be a sequence with one value per layer, got "
                                   f"{type(self.forward).__name__} {quote(self.forward)}")
        n = len(self.forward)
        if n < 1:
            raise LayersError("a model needs at least one layer")
        set_ = object.__setattr__
        set_(self, "forward", _numbers(self.forward, n, "forward"))
        set_(self, "backward", _numbers(self.backward, n, "backward"))
        for name in ("activation_bytes", "parameter_bytes"):
            value = getattr(self, name)
            set_(self, name, _numbers([0.0] * n if value is None else value, n, name))
        if not math.isfinite(sum(self.forward) + sum(self.backward)):  # what the partitioners add up
            raise LayersError("forward + backward times add up past the largest float; give them in a larger unit")
        names = tuple(f"layer{i}" for i in range(n)) if self.names is None else tuple(str(x) for x in self.names)
        if len(names) != n:
            raise LayersError(f"names has {len(names)} entries but there are {n} layers")
        set_(self, "names", names)

    @property
    def layers(self) -> int:
        return len(self.forward)

    @property
    def compute(self) -> tuple[float, ...]:
        """Forward plus backward seconds per layer: the work a stage does per micro-batch."""
        return tuple(f + b for f, b in zip(self.forward, self.backward))


def load_layers(path: str | Path) -> LayerCosts:
    """Read a layers CSV (format in the module docstring); raises :class:`LayersError` naming the problem."""
    path = Path(path)
    name = quote(str(path), 200)
    rows = read_csv_rows(path, what="layers file", error=LayersError, expected=f"the header {','.join(LAYER_COLUMNS)}")
    header = [h.strip() for h in rows[0]]
    if header != list(LAYER_COLUMNS):
        raise LayersError(f"layers file {name} has header {quote(header, 200)}; it must be {','.join(LAYER_COLUMNS)}")
    if len(rows) < 2:
        raise LayersError(f"layers file {name} has a header but no layers; a model needs at least one layer (one row per layer)")
    names, columns = [], [[] for _ in LAYER_COLUMNS[1:]]
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(LAYER_COLUMNS):
            raise LayersError(f"layers file {name}: row {lineno} has {len(row)} cells; expected {len(LAYER_COLUMNS)}")
        names.append(row[0].strip())
        for col, cell, values in zip(LAYER_COLUMNS[1:], row[1:], columns):
            try:
                values.append(float(cell))
            except ValueError:
                raise LayersError(f"layers file {name}: row {lineno}, column {col!r}: {quote(cell)} is not a "
                                  f"number") from None
    try:
        return LayerCosts(forward=columns[0], backward=columns[1], activation_bytes=columns[2],
                          parameter_bytes=columns[3], names=names)
    except LayersError as exc:
        raise LayersError(f"layers file {name}: {exc}") from None


def save_layers(layers: LayerCosts, path: str | Path, *, comments: Sequence[str] = ()) -> Path:
    """Write *layers* as a layers CSV (atomically); *comments* become ``#`` lines at the top."""
    buf = io.StringIO()
    for line in comments:
        buf.write(f"# {line}\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(LAYER_COLUMNS)
    for i in range(layers.layers):
        writer.writerow([layers.names[i], repr(layers.forward[i]), repr(layers.backward[i]),
                         repr(layers.activation_bytes[i]), repr(layers.parameter_bytes[i])])
    return write_text(path, buf.getvalue())
