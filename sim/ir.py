"""The schedule IR: actions, schedules and the dependencies between actions.

A schedule is data. It says, for every device, which computations run there and
in which order; nothing about time. Timing comes out of the engine
(:mod:`sim.engine`), which is why a schedule can be simulated, drawn and executed
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
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from .errors import PipesimError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ActionKind", "Action", "Schedule", "ScheduleError", "NUM_KINDS", "OP_F", "OP_B", "OP_W", "OP_R", "OP_U",
           "OP_SEND_F", "OP_SEND_B", "encode_key", "decode_key", "key_kind", "key_stage", "key_mb", "transfer_op",
           "boundary_stage"]


class ScheduleError(PipesimError):
    """A schedule that cannot run: missing, duplicate or misplaced actions, or a deadlock."""


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

# ------------------------------------------------------------------ the one key codec
# Hot paths (validation, engines, executor, traces) identify an action by one integer,
#     key = (mb * S + stage) * NUM_KINDS + kind ordinal        (S: the schedule's stages)
# so dependencies are integer arithmetic. Every encode and decode goes through the
# functions below; they take Python ints or numpy integer arrays alike.
NUM_KINDS = 5
OP_F, OP_B, OP_W, OP_R, OP_U = range(NUM_KINDS)
"""Kind ordinals, in :class:`ActionKind` order; also the timeline's op codes of computations."""
OP_SEND_F, OP_SEND_B = NUM_KINDS, NUM_KINDS + 1
"""Timeline op codes of transfers: an activation forward, a gradient backward (see :mod:`sim.timeline`)."""
_F, _B, _W, _R, _U = OP_F, OP_B, OP_W, OP_R, OP_U


def encode_key(stage, kind, mb, stages: int):
    """The key of action (*stage*, *kind* ordinal, *mb*) in a schedule of *stages* stages."""
    return (mb * stages + stage) * NUM_KINDS + kind


def key_kind(key):
    """Kind ordinal (OP_F .. OP_U) of *key*."""
    return key % NUM_KINDS


def key_stage(key, stages: int):
    return (key // NUM_KINDS) % stages


def key_mb(key, stages: int):
    """Micro-batch of *key* (the update number for a U)."""
    return key // NUM_KINDS // stages


def decode_key(key: int, stages: int) -> tuple[int, int, int]:
    """(stage, kind ordinal, mb) of *key*."""
    rest, kind = divmod(key, NUM_KINDS)
    mb, stage = divmod(rest, stages)
    return stage, kind, mb


def transfer_op(producer):
    """Timeline op code of the transfer carrying *producer*'s result: SEND_F for a forward, else SEND_B."""
    return OP_SEND_F + (key_kind(producer) != OP_F)  # arithmetic, so ints and arrays alike


def boundary_stage(producer, stages: int):
    """The stage boundary a transfer crosses, as the index of ``StageCosts.send_bytes`` it carries:
    F(s) sends s's activation (boundary s), B(s) sends the gradient of s's input (boundary s-1)."""
    stage = key_stage(producer, stages)
    return stage - (key_kind(producer) != OP_F)

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


@dataclass(frozen=True, slots=True)
class Schedule:
    """Per-device ordered action lists plus the stage -> device placement. Nothing else."""

    name: str
    devices: int
    """K, the number of devices (pipeline ranks)."""
    stages: int
    """S, the number of model stages; S = K unless a device holds several chunks."""
    microbatches: int
    """M, micro-batches per iteration."""
    iterations: int
    placement: tuple[int, ...]
    """placement[stage] -> device."""
    actions: Mapping[int, tuple[Action, ...]]
    """device -> its actions, in execution order."""
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (("devices", self.devices), ("stages", self.stages),
                             ("microbatches", self.microbatches), ("iterations", self.iterations)):
            if not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{label} must be a positive integer, got {value!r}")
        object.__setattr__(self, "placement", tuple(self.placement))
        object.__setattr__(self, "actions", {d: tuple(self.actions.get(d, ())) for d in range(self.devices)})
        if len(self.placement) != self.stages:
            raise ScheduleError(f"placement has {len(self.placement)} entries for {self.stages} stages")
        for stage, device in enumerate(self.placement):
            if not 0 <= device < self.devices:
                raise ScheduleError(f"stage {stage} is placed on device {device}, outside 0..{self.devices - 1}")

    # ----------------------------------------------------------------- views
    @property
    def total_microbatches(self) -> int:
        return self.microbatches * self.iterations

    def __iter__(self) -> Iterator[Action]:
        for device in range(self.devices):
            yield from self.actions[device]

    def __len__(self) -> int:
        return sum(len(a) for a in self.actions.values())

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
        return frozenset((key_stage(k, S), key_mb(k, S)) for k in self.compiled.present if key_kind(k) == kind)

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
        counts = {s: 0 for s in range(self.stages)}
        for a in self:
            if a.kind is ActionKind.U:
                counts[a.stage] += 1
        values = set(counts.values())
        if len(values) != 1:
            raise ScheduleError(f"stages have different numbers of updates: {counts}")
        u = values.pop()
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
        """The schedule as integer keys with every dependency derived (cached)."""
        return self._cached("compiled", lambda: Compiled(self))

    def dependencies(self, action: Action) -> list[Action]:
        """The actions that must finish before *action* may start (derived from the IR rules).

        F(s,m) after F(s-1,m); B(s,m) after B(s+1,m) (last stage: after its own F),
        and after R(s,m) when recomputed; W(s,m) after B(s,m); R(s,m) after F(s,m);
        U(s,u) after every B and W of stage s in update group u.
        """
        return [self.action_of(k) for k in self.compiled.dependency_keys(self.key(action))]

    def expected_actions(self) -> set[Action]:
        """Every action a schedule of this shape must contain exactly once."""
        return {self.action_of(k) for k in self.compiled.expected_keys()}

    # ------------------------------------------------------------ validation
    def validate(self) -> Schedule:
        """Check that the schedule can run; return it, or raise :class:`ScheduleError`.

        Checks: every expected action exactly once, on the device its stage is
        placed on, and per-device orders that let every dependency be met (no
        deadlock). A deadlock names the stuck action of every blocked device and
        what it waits for, with the device x step grid. Runs in linear time; never hangs.
        """
        if self._derived.get("valid"):
            return self
        for device, acts in self.actions.items():
            for a in acts:
                if not (isinstance(a, Action) and 0 <= a.stage < self.stages and a.mb >= 0):
                    raise ScheduleError(f"{a!r} on device {device} is not an action of stages 0..{self.stages - 1}")
                if self.placement[a.stage] != device:
                    raise ScheduleError(
                        f"{a} is on device {device} but stage {a.stage} is placed on device {self.placement[a.stage]}"
                    )
        need = 2 * self.stages * self.total_microbatches  # an F and a B of every (stage, micro-batch)
        if need > len(self) + 1_000_000:  # refused before tables of that size are built (sim.pytorch_format)
            raise ScheduleError(f"{need - len(self)} action(s) missing at least: {self.stages} stage(s) x "
                                f"{self.total_microbatches} micro-batch(es) need {need} F and B actions, the schedule "
                                f"has {len(self)}")
        compiled = self.compiled
        if compiled.duplicates:
            raise ScheduleError(f"{len(compiled.duplicates)} action(s) appear more than once, "
                                f"e.g. {', '.join(str(self.action_of(k)) for k in compiled.duplicates[:8])}")
        expected = compiled.expected_keys()
        missing = sorted(map(self.action_of, expected - compiled.present))
        extra = sorted(map(self.action_of, compiled.present - expected))
        if missing:
            raise ScheduleError(f"{len(missing)} action(s) missing, e.g. {', '.join(map(str, missing[:8]))}")
        if extra:
            raise ScheduleError(
                f"{len(extra)} action(s) outside the schedule's shape (K={self.devices}, S={self.stages}, "
                f"M={self.microbatches}, iterations={self.iterations}), e.g. {', '.join(map(str, extra[:8]))}"
            )
        stuck = self.find_deadlock()
        if stuck:
            lines = [f"device {d}: {a} waits for {', '.join(map(str, deps))}" for d, (a, deps) in stuck.items()]
            raise ScheduleError(
                f"schedule {self.name!r} deadlocks: " + "; ".join(lines) + "\n" + self.format_grid(mark=stuck)
            )
        self._derived["valid"] = True
        return self

    def find_deadlock(self) -> dict[int, tuple[Action, list[Action]]]:
        """Run the orders with zero costs; return {device: (stuck action, unmet deps)} or {} if all run."""
        compiled = self.compiled
        deps = {k: tuple(p if p >= 0 else ~p for p in ps) for k, ps in compiled.deps.items()}
        done: set[int] = set()
        position = [0] * self.devices
        waiting: dict[int, list[int]] = {}  # unmet dependency -> devices blocked on it
        ready = list(range(self.devices))
        while ready:
            device = ready.pop()
            keys = compiled.keys[device]
            i = position[device]
            while i < len(keys):
                key = keys[i]
                unmet = next((d for d in deps[key] if d not in done), None)
                if unmet is not None:
                    waiting.setdefault(unmet, []).append(device)
                    break
                done.add(key)
                i += 1
                woken = waiting.pop(key, None)
                if woken:
                    ready.extend(woken)
            position[device] = i
        stuck = {}
        for device, keys in enumerate(compiled.keys):
            if position[device] < len(keys):
                key = keys[position[device]]
                stuck[device] = (self.action_of(key), [self.action_of(d) for d in deps[key] if d not in done])
        return stuck

    def format_grid(self, mark: Mapping[int, object] = (), width: int = 24) -> str:
        """Device x step grid of the compact actions, like PyTorch's ``_format_pipeline_order``."""
        rows = []
        for device in range(self.devices):
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
        return "\n".join(rows)

    # ------------------------------------------------------------- builders
    @classmethod
    def build(cls, *, name: str, devices: int, microbatches: int, iterations: int = 1,
              placement: Sequence[int] | None = None, actions: Mapping[int, Iterable[Action]]) -> Schedule:
        """Build a schedule; stages default to one per device."""
        placement = tuple(range(devices)) if placement is None else tuple(placement)
        return cls(name=name, devices=devices, stages=len(placement), microbatches=microbatches,
                   iterations=iterations, placement=placement,
                   actions={d: tuple(actions.get(d, ())) for d in range(devices)})

    def replace_actions(self, actions: Mapping[int, Iterable[Action]], name: str | None = None) -> Schedule:
        return Schedule(name=name or self.name, devices=self.devices, stages=self.stages,
                        microbatches=self.microbatches, iterations=self.iterations,
                        placement=self.placement, actions={d: tuple(a) for d, a in actions.items()})

    def to_text(self) -> str:
        """One line per device: ``device: 0F0 0F1 ...``."""
        return "\n".join(f"{d}: {' '.join(map(str, self.actions[d]))}" for d in range(self.devices))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class FlatSchedule:
    """:class:`Compiled` as flat numpy arrays; action *i* is the i-th action in device order.

    An action's inputs are *slots* of a ready-time array of length 2n: slot ``i`` is the
    end of action *i* on its own device, slot ``n + i`` the arrival of its result at the
    device that needs it.
    """

    keys: np.ndarray
    """int64[n]: action keys, device by device, each device's actions in order."""
    device: np.ndarray
    """int64[n]: the device of each action."""
    device_start: np.ndarray
    """int64[K+1]: device d runs actions device_start[d] .. device_start[d+1]-1."""
    dep_start: np.ndarray
    """int64[n+1]: action i's inputs are dep_slot[dep_start[i]:dep_start[i+1]]."""
    dep_slot: np.ndarray
    """int64: input slots (see above), in the order of :attr:`Compiled.deps`."""
    send_to: np.ndarray
    """int64[n]: the device action i's result is sent to, or -1."""


class Compiled:
    """A schedule as integer keys (see :meth:`Schedule.key`), with every dependency derived.

    ``deps[key]`` lists what *key* waits for: a producer key when the producer runs on
    the same device, or ``~producer`` (a negative number) when its result must first
    arrive from another device. ``sends[producer]`` is the device a result travels to.
    """

    def __init__(self, schedule: Schedule) -> None:
        S = schedule.stages
        self.schedule = schedule
        self.keys: list[list[int]] = [
            [encode_key(a.stage, _ORD[a.kind], a.mb, S) for a in schedule.actions[d]] for d in range(schedule.devices)
        ]
        self.present: set[int] = {k for keys in self.keys for k in keys}
        count = sum(len(k) for k in self.keys)
        self.duplicates: list[int] = []
        if count != len(self.present):
            seen: set[int] = set()
            self.duplicates = [k for keys in self.keys for k in keys if k in seen or seen.add(k)]
        placement = schedule.placement
        self.deps: dict[int, tuple[int, ...]] = {}
        self.sends: dict[int, int] = {}
        for device, keys in enumerate(self.keys):
            for key in keys:
                signed = []
                for p in self.dependency_keys(key):
                    if placement[key_stage(p, S)] == device:
                        signed.append(p)
                    else:
                        signed.append(~p)
                        self.sends[p] = device
                self.deps[key] = tuple(signed)

    @cached_property
    def flat(self) -> FlatSchedule:
        """The same actions and dependencies as flat integer arrays (built once, for the fast engine)."""
        import numpy as np  # here, not at the top: the IR itself needs no numpy

        n = sum(len(k) for k in self.keys)
        keys = np.fromiter((k for ks in self.keys for k in ks), dtype=np.int64, count=n)
        device_start = np.zeros(len(self.keys) + 1, dtype=np.int64)
        np.cumsum([len(k) for k in self.keys], out=device_start[1:])
        index = np.full(int(keys.max(initial=-1)) + 1, -1, dtype=np.int64)  # key -> position in *keys*
        index[keys] = np.arange(n)
        deps = self.deps
        counts = np.fromiter((len(deps[k]) for ks in self.keys for k in ks), dtype=np.int64, count=n)
        dep_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=dep_start[1:])
        signed = np.fromiter((p for ks in self.keys for k in ks for p in deps[k]), dtype=np.int64,
                             count=int(dep_start[-1]))
        remote = signed < 0
        dep_slot = index[np.where(remote, ~signed, signed)] + np.where(remote, n, 0)
        send_to = np.full(n, -1, dtype=np.int64)
        if self.sends:
            producers = np.fromiter(self.sends.keys(), dtype=np.int64, count=len(self.sends))
            send_to[index[producers]] = np.fromiter(self.sends.values(), dtype=np.int64, count=len(self.sends))
        device = np.repeat(np.arange(len(self.keys), dtype=np.int64), np.diff(device_start))
        return FlatSchedule(keys=keys, device=device, device_start=device_start, dep_start=dep_start,
                            dep_slot=dep_slot, send_to=send_to)

    def dependency_keys(self, key: int) -> tuple[int, ...]:
        """The producers of *key* (unsigned), by the rules of :meth:`Schedule.dependencies`."""
        S = self.schedule.stages
        s, kind, m = decode_key(key, S)
        base = key - kind  # (s, m) with kind ordinal 0; the neighbour stage is NUM_KINDS away
        if kind == _F:
            return (base - NUM_KINDS,) if s > 0 else ()  # F(s-1, m)
        if kind == _B:
            first = base + NUM_KINDS + _B if s < S - 1 else base + _F  # B(s+1, m), or F(s, m) on the last stage
            return (first, base + _R) if base + _R in self.present else (first,)
        if kind == _W:
            return (base + _B,)
        if kind == _R:
            return (base + _F,)
        g = self.schedule.microbatches_per_update  # U(s, u): every B / W of its group
        present = self.present
        out = []
        for mb in range(m * g, (m + 1) * g):
            b = encode_key(s, 0, mb, S)
            out.append(b + _W if b + _W in present else b + _B)
        return tuple(out)

    def expected_keys(self) -> set[int]:
        sched = self.schedule
        S, total = sched.stages, sched.total_microbatches
        keys = {encode_key(s, kind, m, S) for m in range(total) for s in range(S) for kind in (_F, _B)}
        keys |= {k for k in self.present if key_kind(k) in (_W, _R) and key_mb(k, S) < total}
        keys |= {encode_key(s, _U, u, S) for s in range(S) for u in range(sched.updates_per_stage)}
        return keys
