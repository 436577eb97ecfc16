"""Per-stage cost model: how long each computation takes and how many bytes it moves and keeps.

Units: times in seconds (any unit works if used consistently; the classroom case
uses 1 = one forward), sizes in bytes.

The costs file is a CSV with one row per stage, in stage order::

    stage,forward,backward,weight,recompute,update,send_bytes,activation_bytes,checkpoint_bytes,weight_bytes,grad_bytes,optimizer_bytes
    0,0.010,0.018,0.002,0.010,0.001,4194304,33554432,4194304,16777216,16777216,33554432

Only ``stage`` and ``forward`` are required; a missing column takes the
default of :class:`StageCosts` (``recompute`` defaults to ``forward``,
``checkpoint_bytes`` to the bytes the stage receives).

Optional dispatch columns give the runtime's own time per action (seconds; Python dispatch and bookkeeping
between two computations, what a trace shows as gaps): ``dispatch_forward``, ``dispatch_backward``,
``dispatch_weight``, ``dispatch_recompute``, ``dispatch_update``, or ``dispatch`` for all five at once (a
kind's own column wins). The engines hold the device for it once the action's inputs are there, before it
computes (:attr:`sim.engines.plan.Plan.overhead`); it is not busy time. Files are written with these columns
only when some value is not 0. An optional memory column, ``weight_activation_bytes``, is the part of
``activation_bytes`` a micro-batch still holds from the end of its B until the end of its W when the backward is split (the zero-bubble paper's M_W:
Qi et al., ICLR 2024, section 2.1 and its table of memory per pass: F allocates M_B, B frees M_B - M_W, W frees
M_W). Its default is ``activation_bytes`` (everything kept until W, pipesim's model before this column), and a file
has the column only when some stage differs from that default. Lines starting with ``#``
are comments (calibration records what it measured there). The file is UTF-8, with or
without the byte-order mark Excel writes; a column given twice is refused (which one was
meant?), and so is any value that is not a finite number >= 0.

:func:`check_totals` refuses costs whose sums over a run pass the largest float (1e308 per
action over M micro-batches), so a run never prints inf or nan as a result.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from sim.core.ir import ActionKind
from sim.errors import PipesimError, PipesimTypeError, quote, real_number, whole_number
from sim.files import read_csv_rows, write_text

__all__ = ["StageCosts", "CostsError", "uniform", "load_costs", "save_costs", "COLUMNS", "DISPATCH_COLUMNS",
           "MEMORY_COLUMNS", "ALL_COLUMNS", "check_totals"]


class CostsError(PipesimError):
    """Costs that cannot be used: wrong length, negative or non-numeric values, a malformed file."""


DISPATCH_COLUMNS = ("dispatch_forward", "dispatch_backward", "dispatch_weight", "dispatch_recompute", "dispatch_update")
"""Per-action runtime overhead by kind (F, B, W, R, U: the key codec's order), seconds."""
COLUMNS = ("forward", "backward", "weight", "recompute", "update", "send_bytes", "activation_bytes",
           "checkpoint_bytes", "weight_bytes", "grad_bytes", "optimizer_bytes") + DISPATCH_COLUMNS
MEMORY_COLUMNS = ("weight_activation_bytes",)
"""Optional columns of the memory model whose default follows another column (kept out of :data:`COLUMNS`, which
sweeps report one by one, so that no existing table changes shape)."""
ALL_COLUMNS = COLUMNS + MEMORY_COLUMNS


def _is_sequence(values) -> bool:
    return isinstance(values, (list, tuple)) or (hasattr(values, "__len__") and hasattr(values, "__getitem__")
                                                 and not isinstance(values, (str, bytes, dict)))


def _tuple(values, n: int, name: str) -> tuple[float, ...]:
    """One float per stage from a number (every stage) or a sequence of numbers of any real type (numpy,
    Decimal, Fraction); wrong types are a TypeError naming *name*, bad values a :class:`CostsError`."""
    if not _is_sequence(values):
        if isinstance(values, (str, bytes, dict)) or values is None:
            raise PipesimTypeError(f"{name} must be a number or a sequence of numbers (one per stage), "
                                   f"got {type(values).__name__} {quote(values)}")
        values = [real_number(values, name)] * n
    values = tuple(values)
    if len(values) != n:
        raise CostsError(f"{name} has {len(values)} entries but there are {n} stages; give one value per stage")
    # plain valid floats, the usual case, taken as they are: a NaN or inf makes the sum NaN or inf, and an overflowing
    # sum of finite values only sends them through the full check below
    if values and set(map(type, values)) == {float} and min(values) >= 0.0 and sum(values) < math.inf:
        return values
    out = []
    for i, v in enumerate(values):
        x = real_number(v, f"{name}[{i}]")
        if not math.isfinite(x):
            raise CostsError(f"{name}[{i}] = {quote(v)} is not a finite number")
        if x < 0:
            raise CostsError(f"{name}[{i}] = {quote(v)} is negative; costs and sizes must be >= 0")
        out.append(x)
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Costs of every stage; each field is a tuple with one value per stage."""

    forward: tuple[float, ...]
    """F time of one micro-batch, seconds."""
    backward: tuple[float, ...]
    """B time: the input-gradient part of the backward, seconds."""
    weight: tuple[float, ...] | None = None
    """W time: the weight-gradient part, seconds (0 by default). An unsplit backward costs backward + weight."""
    recompute: tuple[float, ...] | None = None
    """R time: re-running the forward before the backward, seconds (default: forward)."""
    update: tuple[float, ...] | None = None
    """U time: the optimizer step of the stage, seconds (default 0)."""
    send_bytes: tuple[float, ...] | None = None
    """Activation bytes stage s sends to stage s+1 per micro-batch (its gradient comes back with the same size)."""
    activation_bytes: tuple[float, ...] | None = None
    """Bytes stage s keeps per in-flight micro-batch between its F and its B (or W)."""
    checkpoint_bytes: tuple[float, ...] | None = None
    """Bytes kept per micro-batch under re-materialization: the stage input (default: bytes received)."""
    weight_bytes: tuple[float, ...] | None = None
    """Parameter bytes of the stage (one weight version)."""
    grad_bytes: tuple[float, ...] | None = None
    """Gradient-buffer bytes of the stage."""
    optimizer_bytes: tuple[float, ...] | None = None
    """Optimizer-state bytes of the stage."""
    dispatch_forward: tuple[float, ...] | None = None
    """The runtime's own time before each F (dispatch, bookkeeping), seconds (default 0): device time, not busy."""
    dispatch_backward: tuple[float, ...] | None = None
    """The same before each B (a full or an input-gradient backward), seconds (default 0)."""
    dispatch_weight: tuple[float, ...] | None = None
    """The same before each W, seconds (default 0)."""
    dispatch_recompute: tuple[float, ...] | None = None
    """The same before each R, seconds (default 0)."""
    dispatch_update: tuple[float, ...] | None = None
    """The same before each U, seconds (default 0)."""
    weight_activation_bytes: tuple[float, ...] | None = None
    """Of ``activation_bytes``, the bytes still held from the end of B(s,m) until the end of W(s,m) when the backward
    is split (the zero-bubble paper's M_W; B frees the rest). Default: ``activation_bytes`` (all kept until W).
    Never more than ``activation_bytes``."""

    def __post_init__(self) -> None:
        if not _is_sequence(self.forward):
            raise PipesimTypeError(f"forward must be a sequence with one value per stage (use uniform() for equal "
                                   f"stages), got {type(self.forward).__name__} {quote(self.forward)}")
        n = len(self.forward)
        if n < 1:
            raise CostsError("costs need at least one stage")
        defaults = {"weight": 0.0, "recompute": None, "update": 0.0, "send_bytes": 0.0, "activation_bytes": 0.0,
                    "checkpoint_bytes": None, "weight_bytes": 0.0, "grad_bytes": 0.0, "optimizer_bytes": 0.0,
                    **dict.fromkeys(DISPATCH_COLUMNS, 0.0)}
        set_ = object.__setattr__
        set_(self, "forward", _tuple(self.forward, n, "forward"))
        set_(self, "backward", _tuple(self.backward, n, "backward"))
        for name, default in defaults.items():
            value = getattr(self, name)
            if value is None:
                if name == "recompute":
                    value = self.forward
                elif name == "checkpoint_bytes":
                    sent = _tuple(self.send_bytes, n, "send_bytes")
                    value = (sent[0],) + sent[:-1]
                else:
                    value = default
            set_(self, name, _tuple(value, n, name))
        kept = self.weight_activation_bytes
        set_(self, "weight_activation_bytes", self.activation_bytes if kept is None
             else _tuple(kept, n, "weight_activation_bytes"))
        _check_kept(self.weight_activation_bytes, self.activation_bytes)

    @classmethod
    def _checked(cls, columns: dict[str, tuple[float, ...]]) -> StageCosts:
        """Costs from *columns* as they are: every column of :data:`COLUMNS`, each a tuple of one plain, finite
        float >= 0 per stage (what the checks of ``__post_init__`` would make of them), not checked again."""
        costs = object.__new__(cls)
        for name in COLUMNS:
            value = columns.get(name) if name in DISPATCH_COLUMNS else columns[name]
            object.__setattr__(costs, name, (0.0,) * len(columns["forward"]) if value is None else value)
        kept = columns.get("weight_activation_bytes")
        object.__setattr__(costs, "weight_activation_bytes", columns["activation_bytes"] if kept is None else kept)
        _check_kept(costs.weight_activation_bytes, costs.activation_bytes)
        return costs

    @property
    def stages(self) -> int:
        return len(self.forward)

    def cost(self, stage: int, kind: ActionKind, *, split: bool = True) -> float:
        """Duration of one action. *split* False: B is a full backward (input + weight gradient)."""
        if kind is ActionKind.F:
            return self.forward[stage]
        if kind is ActionKind.B:
            return self.backward[stage] if split else self.backward[stage] + self.weight[stage]
        if kind is ActionKind.W:
            return self.weight[stage]
        if kind is ActionKind.R:
            return self.recompute[stage]
        return self.update[stage]

    def dispatch_table(self) -> list[list[float]] | None:
        """stage -> [F, B, W, R, U] dispatch overhead (seconds, the key codec's kind order), or None when all are 0."""
        columns = [getattr(self, c) for c in DISPATCH_COLUMNS]
        if not any(any(c) for c in columns):
            return None
        return [list(row) for row in zip(*columns)]

    def with_dispatch(self, seconds) -> StageCosts:
        """These costs with the dispatch overhead *seconds*: a number (every action), or stage -> {kind letter
        ``F``/``B``/``W``/``R``/``U``: seconds} (kinds not given keep their value)."""
        values = {c: list(getattr(self, c)) for c in DISPATCH_COLUMNS}
        values["weight_activation_bytes"] = self.weight_activation_bytes
        letters = dict(zip("FBWRU", DISPATCH_COLUMNS))
        if isinstance(seconds, dict):
            for stage, per in seconds.items():
                for letter, value in per.items():
                    values[letters[letter]][stage] = value
        else:
            values = {c: [seconds] * self.stages for c in DISPATCH_COLUMNS}
            values["weight_activation_bytes"] = self.weight_activation_bytes
        return StageCosts(**{**{c: getattr(self, c) for c in COLUMNS}, **values})

    def written_columns(self) -> tuple[str, ...]:
        """The columns a file of these costs needs: :data:`COLUMNS`, the dispatch ones only when some is not 0."""
        columns = COLUMNS if self.dispatch_table() is not None else tuple(c for c in COLUMNS
                                                                          if c not in DISPATCH_COLUMNS)
        if self.weight_activation_bytes != self.activation_bytes:
            columns += MEMORY_COLUMNS
        return columns

    def kept_after_b(self) -> tuple[float, ...] | None:
        """Per stage, the activation bytes a split backward's B frees (``activation_bytes -
        weight_activation_bytes``), or None when every stage keeps all of them until W (the default model)."""
        if self.weight_activation_bytes == self.activation_bytes:
            return None
        return tuple(a - k for a, k in zip(self.activation_bytes, self.weight_activation_bytes))

    def scaled(self, factor: float) -> StageCosts:
        """Times multiplied by *factor* (sizes and the runtime's dispatch overhead unchanged)."""
        times = ("forward", "backward", "weight", "recompute", "update")
        return StageCosts(**{c: tuple(v * factor for v in getattr(self, c)) if c in times else getattr(self, c)
                             for c in ALL_COLUMNS})

    def split_into_chunks(self, chunks: int) -> StageCosts:
        """Each stage cut into *chunks* equal consecutive pieces (times and kept bytes / chunks; the dispatch
        overhead is per action, so each piece keeps it whole)."""
        per = {}
        for c in ALL_COLUMNS:
            values = getattr(self, c)
            if c in ("send_bytes", "checkpoint_bytes") or c in DISPATCH_COLUMNS:
                per[c] = tuple(v for v in values for _ in range(chunks))
            else:
                per[c] = tuple(v / chunks for v in values for _ in range(chunks))
        return StageCosts(**per)

    def to_dict(self) -> dict[str, list[float]]:
        return {c: list(getattr(self, c)) for c in self.written_columns()}


def uniform(stages: int, *, forward: float = 1.0, backward: float = 2.0, weight: float = 0.0,
            recompute: float | None = None, update: float = 0.0, send_bytes: float = 0.0,
            activation_bytes: float = 0.0, checkpoint_bytes: float | None = None, weight_bytes: float = 0.0,
            grad_bytes: float = 0.0, optimizer_bytes: float = 0.0, dispatch_forward: float = 0.0,
            dispatch_backward: float = 0.0, dispatch_weight: float = 0.0, dispatch_recompute: float = 0.0,
            dispatch_update: float = 0.0, weight_activation_bytes: float | None = None) -> StageCosts:
    """The classroom case: every stage costs the same."""
    stages = whole_number(stages, "stages")
    if stages < 1:
        raise CostsError(f"stages must be a positive integer, got {stages!r}")
    given = {"forward": forward, "backward": backward, "weight": weight, "recompute": recompute, "update": update,
             "send_bytes": send_bytes, "activation_bytes": activation_bytes, "checkpoint_bytes": checkpoint_bytes,
             "weight_bytes": weight_bytes, "grad_bytes": grad_bytes, "optimizer_bytes": optimizer_bytes,
             "dispatch_forward": dispatch_forward, "dispatch_backward": dispatch_backward,
             "dispatch_weight": dispatch_weight, "dispatch_recompute": dispatch_recompute,
             "dispatch_update": dispatch_update, "weight_activation_bytes": weight_activation_bytes}
    if all(v is None or (type(v) is float and 0.0 <= v < math.inf) for v in given.values()):
        # plain valid floats (the usual case): each checked once here, not once per stage by StageCosts
        columns = {name: None if v is None else (v,) * stages for name, v in given.items()}
        columns["recompute"] = columns["recompute"] or columns["forward"]  # StageCosts' defaults
        columns["checkpoint_bytes"] = columns["checkpoint_bytes"] or columns["send_bytes"]
        return StageCosts._checked(columns)
    return StageCosts(
        forward=[forward] * stages, backward=[backward] * stages, weight=[weight] * stages,
        recompute=None if recompute is None else [recompute] * stages, update=[update] * stages,
        send_bytes=[send_bytes] * stages, activation_bytes=[activation_bytes] * stages,
        checkpoint_bytes=None if checkpoint_bytes is None else [checkpoint_bytes] * stages,
        weight_bytes=[weight_bytes] * stages, grad_bytes=[grad_bytes] * stages,
        optimizer_bytes=[optimizer_bytes] * stages,
        weight_activation_bytes=None if weight_activation_bytes is None else [weight_activation_bytes] * stages,
        **{c: [given[c]] * stages for c in DISPATCH_COLUMNS})


def load_costs(path: str | Path) -> StageCosts:
    """Read a costs CSV (format in the module docstring); raises :class:`CostsError` naming the problem."""
    path = Path(path)
    name = quote(str(path), 200)
    rows = read_csv_rows(path, what="costs file", error=CostsError, expected="a header 'stage,forward,backward,...'")
    header = [h.strip() for h in rows[0]]
    unknown = [h for h in header if h not in ALL_COLUMNS and h not in ("stage", "dispatch")]
    if "stage" not in header or "forward" not in header or unknown:
        raise CostsError(f"costs file {name} has header {quote(header, 200)}; it needs 'stage' and 'forward', "
                         f"and may have {list(ALL_COLUMNS) + ['dispatch']}")
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:  # csv.DictReader would keep the last silently: which one did the user mean?
        raise CostsError(f"costs file {name} has the column(s) {repeated} more than once; keep one of each")
    columns: dict[str, list[float]] = {h: [] for h in header}
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise CostsError(f"costs file {name}: row {lineno} has {len(row)} cells but the header has "
                             f"{len(header)}")
        for key, raw in zip(header, row):
            try:
                value = float(raw)
            except ValueError:
                raise CostsError(f"costs file {name}: row {lineno}, column {key!r}: {quote(raw)} is not a "
                                 f"number") from None
            if not math.isfinite(value):
                raise CostsError(f"costs file {name}: row {lineno}, column {key!r}: {quote(raw)} is not a "
                                 f"finite number")
            columns[key].append(value)
    stages = columns.pop("stage")
    if not stages:
        raise CostsError(f"costs file {name} has a header but no rows; give one row per stage")
    if stages != list(range(len(stages))):
        raise CostsError(f"costs file {name}: the stage column must read 0, 1, 2, ... in order")
    if "backward" not in columns:
        columns["backward"] = [0.0] * len(stages)
    every_kind = columns.pop("dispatch", None)  # the shorthand: each kind's own column wins
    if every_kind is not None:
        for c in DISPATCH_COLUMNS:
            columns.setdefault(c, every_kind)
    try:
        return StageCosts(**columns)
    except CostsError as exc:
        raise CostsError(f"costs file {name}: {exc}") from None


def save_costs(costs: StageCosts, path: str | Path, *, comments: Sequence[str] = ()) -> Path:
    """Write *costs* as a costs CSV (atomically); *comments* become ``#`` lines at the top."""
    path = Path(path)
    buf = io.StringIO()
    for line in comments:
        buf.write(f"# {line}\n")
    writer = csv.writer(buf, lineterminator="\n")
    columns = costs.written_columns()
    writer.writerow(("stage",) + columns)
    for s in range(costs.stages):
        writer.writerow([s] + [repr(getattr(costs, c)[s]) for c in columns])
    return write_text(path, buf.getvalue())


def check_totals(costs: StageCosts, microbatches: int) -> None:
    """Refuse costs whose totals pass the largest float (about 1.8e308), before a run would print inf or nan.

    An upper bound suffices: every time of a run is at most the sum of all its computations, and every memory
    figure at most the sum of all the bytes any stage could hold (*microbatches*: all of a run's micro-batches;
    one weight version per update at most). Plain Python float sums overflow to inf without a warning.
    """
    n = microbatches + 1
    times = sum(f + b + w + r + u for f, b, w, r, u in
                zip(costs.forward, costs.backward, costs.weight, costs.recompute, costs.update))
    times += sum(sum(getattr(costs, c)) for c in DISPATCH_COLUMNS)
    if not math.isfinite(times * n):
        raise CostsError(f"the costs add up past the largest number a float holds: {microbatches} micro-batches of "
                         f"these times overflow; give the times in a larger unit (e.g. seconds, not nanoseconds)")
    held = sum(costs.weight_bytes) + sum(costs.grad_bytes) + sum(costs.optimizer_bytes)
    kept = sum(costs.activation_bytes) + sum(costs.checkpoint_bytes) + sum(costs.send_bytes)
    if not math.isfinite(held * n + kept * n):
        raise CostsError(f"the byte sizes add up past the largest number a float holds over {microbatches} "
                         f"micro-batches; give sizes in a larger unit or check them for a typo")


def _check_kept(kept: tuple[float, ...], activation: tuple[float, ...]) -> None:
    """weight_activation_bytes is a part of activation_bytes: never more (W cannot hold what F never allocated)."""
    for s, (k, a) in enumerate(zip(kept, activation)):
        if k > a:
            raise CostsError(f"weight_activation_bytes[{s}] = {k:.6g} is more than activation_bytes[{s}] = {a:.6g}; "
                             f"it is the part of the activations kept from B until W")


assert {f.name for f in fields(StageCosts)} == set(ALL_COLUMNS)
