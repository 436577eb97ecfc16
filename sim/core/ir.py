"""The schedule IR: actions, schedules and the dependencies between actions.

A schedule is data. It says, for every device, which computations run there and
in which order; nothing about time. Timing comes out of the engine
(:mod:`sim.engines.simpy_engine`), which is why a schedule can be simulated, drawn and executed
on real devices from the same object.

Vocabulary (PyTorch's compact text, ``{stage}{kind}{index}``):

- ``2F0``: stage 2, forward of micro-batch 0.
- ``2B0``: backward of micro-batch 0. The full backward, or only the input
  gradient when the schedule also has a ``W`` for the same micro-batch.
- ``2W0``: weight gradient of micro-batch 0 (zero-bubble schedules).
- ``2R0``: recompute (re-materialize) the forward of micro-batch 0 before ``2B0``.
- ``2U1``: optimizer update number 1 of stage 2.

Micro-batch indices run over all iterations: micro-batch ``m`` belongs to
iteration ``m // M``. Update ``u`` of a stage consumes the gradients of the
micro-batches ``[u*g, (u+1)*g)`` where ``g = M * iterations / updates`` (``g = M``
for flush schedules, ``g = 1`` for PipeDream).

Dependencies are derived, never stored (:meth:`Schedule.dependencies`).
"""

from __future__ import annotations

import enum
import operator
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sim.core.compiled import Compiled, check_structure, find_stall, stuck_actions
from sim.core.keys import (NUM_KINDS, OP_B, OP_F, OP_R, OP_SEND_B, OP_SEND_F, OP_U, OP_W, ScheduleError,
                           boundary_stage, decode_key, encode_key, key_kind, key_mb, key_stage, microbatch_shift,
                           transfer_op)

import numpy as np

__all__ = ["ActionKind", "Action", "Schedule", "ScheduleError", "NUM_KINDS", "OP_F", "OP_B", "OP_W", "OP_R", "OP_U",
           "OP_SEND_F", "OP_SEND_B", "encode_key", "decode_key", "key_kind", "key_stage", "key_mb", "microbatch_shift",
           "transfer_op",
           "boundary_stage"]


class ActionKind(str, enum.Enum):
    """What an action computes. The value is the letter used in the compact text."""

    F = "F"  # forward
    B = "B"  # backward (input gradient only if the schedule has a W for the same micro-batch)
    W = "W"  # weight gradient
    R = "R"  # recompute of a forward (re-materialization)
    U = "U"  # optimizer update of one stage

    def __str__(self) -> str:
        return self.value


_KINDS = tuple(ActionKind)  # ordinal -> kind: F, B, W, R, U
_ORD = {k: i for i, k in enumerate(_KINDS)}

_F, _B, _W, _R, _U = OP_F, OP_B, OP_W, OP_R, OP_U

_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBWRU])\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One computation of one stage: ``Action(2, ActionKind.F, 0)`` prints as ``2F0``."""

    stage: int
    kind: ActionKind
    mb: int
    """Micro-batch index (global over iterations), or the update number for ``U``."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.mb}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``'2F0'`` back into an action; raises ``ValueError`` naming the bad text."""
        match = _ACTION_RE.match(text)
        if match is None:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected <stage><kind><index> with kind one of F, B, W, R, U, e.g. '2F0'"
            )
        return cls(int(match[1]), ActionKind(match[2]), int(match[3]))


def F(stage: int, mb: int) -> Action:
    return Action(stage, ActionKind.F, mb)


def B(stage: int, mb: int) -> Action:
    return Action(stage, ActionKind.B, mb)


def W(stage: int, mb: int) -> Action:
    return Action(stage, ActionKind.W, mb)


def R(stage: int, mb: int) -> Action:
    return Action(stage, ActionKind.R, mb)


def U(stage: int, update: int) -> Action:
    return Action(stage, ActionKind.U, update)


class Schedule:
    """Per-device ordered action lists plus the stage -> device placement. Nothing else.

    Stored as the integer keys of the codec above: one int64 array, device by device
    (:attr:`keys_array`, :attr:`device_start`), which generators build directly. The
    :class:`Action` view (:attr:`actions`, iteration) is made on first use. Immutable.
    """

    __slots__ = ("name", "devices", "stages", "microbatches", "iterations", "placement", "_keys", "_device_start",
                 "_fused", "_derived")

    def __init__(self, *, name: str, devices: int, stages: int, microbatches: int, iterations: int,
                 placement: Sequence[int], actions: Mapping[int, Iterable[Action]] | None = None,
                 keys: np.ndarray | None = None, device_start: np.ndarray | None = None,
                 overlapped: Iterable[tuple[Action, Action]] | None = None, fused: np.ndarray | None = None) -> None:
        """Either *actions* (device -> its Actions in order) or *keys* and *device_start* (the arrays above).

        Overlapped forward-backward pairs (DualPipe's, PyTorch's ``OVERLAP_F_B``) run as one unit: give them
        as *overlapped* (pairs of Actions, F then B, adjacent on one device) or as *fused* (positions i in
        the key array whose action runs fused with action i+1).
        """
        shape = {}
        for label, value in (("devices", devices), ("stages", stages),
                             ("microbatches", microbatches), ("iterations", iterations)):
            try:
                shape[label] = operator.index(value)  # ints and numpy ints alike; not 2.0, not True
            except TypeError:
                shape[label] = None
            if shape[label] is None or isinstance(value, bool) or shape[label] < 1:
                raise ScheduleError(f"{label} must be a positive integer, got {value!r}")
        devices, stages, microbatches, iterations = (shape[k] for k in ("devices", "stages", "microbatches",
                                                                        "iterations"))
        try:
            placement = tuple(operator.index(d) for d in placement)  # ints, numpy ints alike
        except TypeError:
            raise ScheduleError(f"placement must list one device number per stage, got {placement!r}") from None
        if len(placement) != stages:
            raise ScheduleError(f"placement has {len(placement)} entries for {stages} stages")
        for stage, device in enumerate(placement):
            if not 0 <= device < devices:
                raise ScheduleError(f"stage {stage} is placed on device {device}, outside 0..{devices - 1}")
        put = object.__setattr__
        for attr, value in (("name", name), ("devices", devices), ("stages", stages), ("microbatches", microbatches),
                            ("iterations", iterations), ("placement", placement), ("_derived", {})):
            put(self, attr, value)
        if keys is None:
            keys, device_start = self._encode(actions or {})
        else:
            keys = np.ascontiguousarray(keys, dtype=np.int64)
            device_start = np.ascontiguousarray(device_start, dtype=np.int64)
            if device_start.shape != (devices + 1,) or device_start[0] != 0 or device_start[-1] != len(keys) \
                    or (np.diff(device_start) < 0).any():
                raise ScheduleError(f"device_start must run from 0 to {len(keys)} in {devices} steps")
        keys.flags.writeable = False
        device_start.flags.writeable = False
        put(self, "_keys", keys)
        put(self, "_device_start", device_start)
        if overlapped is not None:
            fused = self._positions_of(overlapped)
        fused = np.zeros(0, dtype=np.int64) if fused is None else np.unique(np.asarray(fused, dtype=np.int64))
        fused.flags.writeable = False
        put(self, "_fused", fused)

    def _positions_of(self, pairs: Iterable[tuple[Action, Action]]) -> list[int]:
        """Positions of the forwards of overlapped *pairs*; a pair that is not (F, B) back to back is refused."""
        order = np.argsort(self._keys, kind="stable")
        positions = []
        for pair in pairs:
            try:
                first, second = pair
                k1, k2 = self.key(first), self.key(second)
            except (TypeError, ValueError, KeyError, AttributeError):
                raise ScheduleError(f"an overlapped pair must be two Actions (F, B), got {pair!r}") from None
            at = int(np.searchsorted(self._keys[order], k1))
            i = int(order[at]) if at < len(order) else -1
            if i < 0 or self._keys[i] != k1 or i + 1 >= len(self._keys) or self._keys[i + 1] != k2:
                raise ScheduleError(f"overlapped pair ({first};{second}) must be two actions that run back to back "
                                    f"on one device, the forward first")
            positions.append(i)
        return positions

    def _encode(self, actions: Mapping[int, Iterable[Action]]):
        """Keys of hand-made Action lists; an action the codec cannot hold is reported by :meth:`validate`."""
        lists = {d: tuple(actions.get(d, ())) for d in range(self.devices)}
        S = self.stages
        out: list[int] = []
        counts = []
        for device in range(self.devices):
            acts = lists[device]
            for a in acts:
                if not (isinstance(a, Action) and isinstance(a.stage, int) and 0 <= a.stage < S
                        and isinstance(a.mb, int) and a.mb >= 0):
                    self._derived["unencodable"] = (
                        f"{a!r} on device {device} is not an action of stages 0..{S - 1}")
                    self._derived["actions"] = lists  # kept as given, for the error and for inspection
                    return np.zeros(0, dtype=np.int64), np.zeros(self.devices + 1, dtype=np.int64)
                out.append(encode_key(a.stage, _ORD[a.kind], a.mb, S))
            counts.append(len(acts))
        device_start = np.zeros(self.devices + 1, dtype=np.int64)
        np.cumsum(counts, out=device_start[1:])
        return np.array(out, dtype=np.int64), device_start

    def __setattr__(self, name, value):
        raise AttributeError(f"Schedule is immutable; use replace_actions() or a generator (setting {name!r})")

    def __delattr__(self, name):
        raise AttributeError("Schedule is immutable")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return ((self.name, self.devices, self.stages, self.microbatches, self.iterations, self.placement)
                == (other.name, other.devices, other.stages, other.microbatches, other.iterations, other.placement)
                and np.array_equal(self._fused, other._fused)
                and (np.array_equal(self._keys, other._keys) and np.array_equal(self._device_start, other._device_start)
                     if "unencodable" not in self._derived and "unencodable" not in other._derived
                     else self.actions == other.actions))

    __hash__ = None  # mutable-looking contents (dicts of tuples); compare with ==

    def __repr__(self) -> str:
        return (f"Schedule(name={self.name!r}, devices={self.devices}, stages={self.stages}, "
                f"microbatches={self.microbatches}, iterations={self.iterations}, actions={len(self)})")

    def __reduce__(self):  # pickled as its arrays (sweeps send schedules to worker processes)
        return (_rebuild, (self.name, self.devices, self.stages, self.microbatches, self.iterations, self.placement,
                           self._keys, self._device_start, self._derived.get("actions"), self._fused))

    # ----------------------------------------------------------------- views
    @property
    def keys_array(self) -> np.ndarray:
        """int64[n]: every action's key, device by device, each device's in order (read-only)."""
        return self._keys

    @property
    def device_start(self) -> np.ndarray:
        """int64[K+1]: device d's actions are keys_array[device_start[d]:device_start[d+1]] (read-only)."""
        return self._device_start

    @property
    def fused(self) -> np.ndarray:
        """int64: positions i (in :attr:`keys_array`) whose action runs fused with action i+1 (read-only)."""
        return self._fused

    @property
    def overlapped(self) -> tuple[tuple[Action, Action], ...]:
        """The overlapped forward-backward pairs, each run as one unit (DualPipe; PyTorch's ``OVERLAP_F_B``)."""
        return tuple((self.action_of(int(self._keys[i])), self.action_of(int(self._keys[i + 1])))
                     for i in self._fused.tolist())

    @property
    def actions(self) -> Mapping[int, tuple[Action, ...]]:
        """device -> its actions, in execution order (Action objects, made on first use)."""
        return self._cached("actions", self._make_actions)

    def _make_actions(self) -> dict[int, tuple[Action, ...]]:
        S, keys = self.stages, self._keys
        stage, kind, mb = key_stage(keys, S), key_kind(keys), key_mb(keys, S)
        kinds = _KINDS
        flat = [Action(s, kinds[k], m) for s, k, m in zip(stage.tolist(), kind.tolist(), mb.tolist())]
        bounds = self._device_start.tolist()
        return {d: tuple(flat[bounds[d]:bounds[d + 1]]) for d in range(self.devices)}

    @property
    def total_microbatches(self) -> int:
        return self.microbatches * self.iterations

    def __iter__(self) -> Iterator[Action]:
        for device in range(self.devices):
            yield from self.actions[device]

    def __len__(self) -> int:
        if "unencodable" in self._derived:
            return sum(len(a) for a in self._derived["actions"].values())
        return len(self._keys)

    def device_of(self, action: Action) -> int:
        return self.placement[action.stage]

    def stages_of(self, device: int) -> list[int]:
        return [s for s, d in enumerate(self.placement) if d == device]

    @property
    def split_backward(self) -> frozenset[tuple[int, int]]:
        """(stage, mb) pairs whose backward is split into B (input grad) and W (weight grad)."""
        return self._cached("split", lambda: self._pairs_with(_W))

    @property
    def recomputed(self) -> frozenset[tuple[int, int]]:
        """(stage, mb) pairs whose forward is recomputed (R) before the backward."""
        return self._cached("recomputed", lambda: self._pairs_with(_R))

    def _pairs_with(self, kind: int) -> frozenset[tuple[int, int]]:
        S = self.stages
        keys = self._keys[key_kind(self._keys) == kind]
        return frozenset(zip(key_stage(keys, S).tolist(), key_mb(keys, S).tolist()))

    @property
    def updates_per_stage(self) -> int:
        return self._cached("updates", self._count_updates)

    @property
    def microbatches_per_update(self) -> int:
        """g: how many micro-batches' gradients one update consumes."""
        u = self.updates_per_stage
        return self.total_microbatches // u if u else self.total_microbatches

    def iteration_of(self, action: Action) -> int:
        if action.kind is ActionKind.U:
            return action.mb * self.microbatches_per_update // self.microbatches
        return action.mb // self.microbatches

    def _cached(self, key, compute):
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def _count_updates(self) -> int:
        S = self.stages
        u_keys = self._keys[key_kind(self._keys) == _U]
        counts = np.bincount(key_stage(u_keys, S), minlength=S)
        if counts.min() != counts.max():
            raise ScheduleError(f"stages have different numbers of updates: {dict(enumerate(counts.tolist()))}")
        u = int(counts[0])
        if u and self.total_microbatches % u:
            raise ScheduleError(f"{u} updates per stage do not divide {self.total_microbatches} micro-batches evenly")
        return u

    # ---------------------------------------------------------- dependencies
    # Hot paths (validation, engines) work on integer keys instead of Action objects (the key codec above).
    def key(self, action: Action) -> int:
        return encode_key(action.stage, _ORD[action.kind], action.mb, self.stages)

    def action_of(self, key: int) -> Action:
        stage, kind, mb = decode_key(key, self.stages)
        return Action(stage, _KINDS[kind], mb)

    @property
    def compiled(self) -> Compiled:
        """The schedule's dependencies as arrays and per-key views (:class:`sim.core.compiled.Compiled`; cached)."""
        if "compiled" not in self._derived:  # read several times per simulation: built once
            self._derived["compiled"] = Compiled(self)
        return self._derived["compiled"]

    def dependencies(self, action: Action) -> list[Action]:
        """The actions that must finish before *action* may start (derived from the IR rules).

        F(s,m) after F(s-1,m); B(s,m) after B(s+1,m) (last stage: after its own F),
        and after R(s,m) when recomputed; W(s,m) after B(s,m); R(s,m) after F(s,m);
        U(s,u) after every B and W of stage s in update group u. The forward of an
        overlapped pair also waits for its backward's inputs (the pair starts as one unit).
        """
        key = self.key(action)
        keys = list(self.compiled.dependency_keys(key))
        partner = self._partners().get(key)
        if partner is not None:
            keys += [k for k in self.compiled.dependency_keys(partner) if k not in keys]
        return [self.action_of(k) for k in keys]

    def _partners(self) -> dict[int, int]:
        """forward key -> backward key of each overlapped pair."""
        return self._cached("partners", lambda: dict(zip(self._keys[self._fused].tolist(),
                                                          self._keys[self._fused + 1].tolist())))

    def expected_actions(self) -> set[Action]:
        """Every action a schedule of this shape must contain exactly once."""
        return {self.action_of(k) for k in self.compiled.expected_keys()}

    # ------------------------------------------------------------ validation
    def check_structure(self) -> Schedule:
        """Every expected action exactly once, on the device its stage is placed on (vectorised); no deadlock
        check. Raises :class:`ScheduleError`; returns the schedule."""
        if "structure" not in self._derived:
            if "unencodable" in self._derived:
                raise ScheduleError(self._derived["unencodable"])
            self._derived.setdefault("updates", check_structure(self))  # counted on the way: cached
            self._derived["structure"] = True
        return self

    def validate(self) -> Schedule:
        """Check that the schedule can run; return it, or raise :class:`ScheduleError`.

        Checks: every expected action exactly once, on the device its stage is
        placed on (vectorised), and per-device orders that let every dependency be
        met: the engines' list scheduler runs the orders with zero costs, and a
        device that stalls is deadlocked. The error names the stuck action of every
        blocked device and what it waits for, with the device x step grid. Linear
        time; never hangs.
        """
        if self._derived.get("valid"):
            return self
        self.check_structure()
        position = find_stall(self.compiled.flat)
        if (position < self._device_start[1:]).any():
            raise self.deadlock_error(position)
        self._derived["valid"] = True
        return self

    def find_deadlock(self) -> dict[int, tuple[Action, list[Action]]]:
        """Run the orders with zero costs; return {device: (stuck action, unmet deps)} or {} if all run."""
        self.check_structure()
        flat = self.compiled.flat
        stuck = stuck_actions(flat, find_stall(flat))
        return {d: (self.action_of(k), [self.action_of(p) for p in unmet]) for d, (k, unmet) in stuck.items()}

    def deadlock_error(self, position) -> ScheduleError:
        """The error for a run that stalled with each device at *position* (the list scheduler's final state)."""
        stuck = {d: (self.action_of(k), [self.action_of(p) for p in unmet])
                 for d, (k, unmet) in stuck_actions(self.compiled.flat, position).items()}
        lines = [f"device {d}: {a} waits for {', '.join(map(str, deps))}" for d, (a, deps) in stuck.items()]
        return ScheduleError(f"schedule {self.name!r} deadlocks: " + "; ".join(lines) + "\n"
                             + self.format_grid(mark=stuck))

    def format_grid(self, mark: Mapping[int, object] = (), width: int = 24, max_devices: int = 64) -> str:
        """Device x step grid of the compact actions, like PyTorch's ``_format_pipeline_order``.

        Devices in *mark* ({device: (action, ...)}) are centred on that action; at most *max_devices*
        rows are shown (the marked ones first), so a grid of a huge run stays readable.
        """
        shown = sorted(set(list(mark)[:max_devices]) | set(range(min(self.devices, max_devices - len(mark)))))
        rows = []
        for device in shown:
            acts = self.actions[device]
            pos = None
            if device in mark:
                pos = acts.index(mark[device][0])
            lo = 0 if pos is None else max(0, pos - width // 2)
            cells = [str(a) for a in acts[lo:lo + width]]
            if pos is not None:
                cells[pos - lo] = f"[{cells[pos - lo]}]"
            prefix = "... " if lo else ""
            suffix = " ..." if lo + width < len(acts) else ""
            flag = "  <-- stuck" if pos is not None else ""
            rows.append(f"  device {device}: {prefix}{' '.join(cells)}{suffix}{flag}")
        if len(shown) < self.devices:
            rows.append(f"  ... {self.devices - len(shown)} more devices")
        return "\n".join(rows)

    # ------------------------------------------------------------- builders
    @classmethod
    def build(cls, *, name: str, devices: int, microbatches: int, iterations: int = 1,
              placement: Sequence[int] | None = None, actions: Mapping[int, Iterable[Action]],
              overlapped: Iterable[tuple[Action, Action]] | None = None) -> Schedule:
        """Build a schedule; stages default to one per device."""
        placement = tuple(range(devices)) if placement is None else tuple(placement)
        return cls(name=name, devices=devices, stages=len(placement), microbatches=microbatches,
                   iterations=iterations, placement=placement, actions=actions, overlapped=overlapped)

    @classmethod
    def from_keys(cls, *, name: str, devices: int, microbatches: int, iterations: int = 1,
                  placement: Sequence[int] | None = None, keys, device_start, fused=None) -> Schedule:
        """Build a schedule from its key array (see :attr:`keys_array`); stages default to one per device."""
        placement = tuple(range(devices)) if placement is None else tuple(placement)
        return cls(name=name, devices=devices, stages=len(placement), microbatches=microbatches,
                   iterations=iterations, placement=placement, keys=keys, device_start=device_start, fused=fused)

    def replace_actions(self, actions: Mapping[int, Iterable[Action]], name: str | None = None,
                        overlapped: Iterable[tuple[Action, Action]] | None = None) -> Schedule:
        """The same shape with other actions (and overlapped pairs: none unless given)."""
        return Schedule(name=name or self.name, devices=self.devices, stages=self.stages,
                        microbatches=self.microbatches, iterations=self.iterations,
                        placement=self.placement, actions={d: tuple(a) for d, a in actions.items()},
                        overlapped=overlapped)

    def replace_keys(self, keys, device_start, name: str | None = None, fused=None) -> Schedule:
        """The same shape with other actions, given as keys (see :attr:`keys_array`) and fused positions."""
        return Schedule(name=name or self.name, devices=self.devices, stages=self.stages,
                        microbatches=self.microbatches, iterations=self.iterations,
                        placement=self.placement, keys=keys, device_start=device_start, fused=fused)

    def to_text(self) -> str:
        """One line per device: ``device: 0F0 0F1 ...``; an overlapped pair reads ``(0F7;7B3)``."""
        fused = set(self._fused.tolist())
        bounds = self._device_start.tolist()
        lines = []
        for d in range(self.devices):
            cells, acts, i = [], self.actions[d], 0
            while i < len(acts):
                if bounds[d] + i in fused:
                    cells.append(f"({acts[i]};{acts[i + 1]})")
                    i += 2
                else:
                    cells.append(str(acts[i]))
                    i += 1
            lines.append(f"{d}: {' '.join(cells)}")
        return "\n".join(lines)


def _rebuild(name, devices, stages, microbatches, iterations, placement, keys, device_start, actions, fused=None):
    if actions is not None:  # a schedule holding actions the codec cannot encode: keep them as given
        # with its overlapped pairs: their positions are those of the actions' order, which the keys follow.
        # Dropped here, a DualPipeV whose actions had been read came out of a worker process unpaired: the
        # validator's ranks ran its pairs as separate actions while the prediction ran them as units
        return Schedule(name=name, devices=devices, stages=stages, microbatches=microbatches, iterations=iterations,
                        placement=placement, actions=actions, fused=fused)
    return Schedule(name=name, devices=devices, stages=stages, microbatches=microbatches, iterations=iterations,
                    placement=placement, keys=keys, device_start=device_start, fused=fused)
