"""Workloads: what each stage computes when a schedule runs on real devices.

A workload turns a stage index into a *stage runtime*: the object the executor
(:mod:`validate.rank.executor`) calls for F, B, W, R and U. Three kinds:

- ``mlp``: every stage is ``depth`` blocks of ``Linear(width, width) + GELU``;
  input ``(batch, width)``.
- ``transformer``: every stage is ``depth`` ``nn.TransformerEncoderLayer``
  (``d_model``, ``heads``, dropout 0); input ``(batch, seq, d_model)``.
- ``package.module:function``: the user's own model (:mod:`validate.rank.user_model`: stage
  modules, a batch maker and a loss, checked before any rank starts).
- ``emulated``: no model; every action waits for exactly the time the costs file
  gives it (``time.sleep``, waking early by the lateness it has seen and spinning the
  rest: :class:`Sleeper`) and sends a tensor of ``send_bytes``. Lets K exceed the
  cores to check scheduling and communication. Compute is *emulated*, and outputs say so.

Real stages run on a *weight version*: a dict of parameters, bound into the stage's
module before a forward that needs another version than the bound one
(:meth:`TorchStage._bind`). An update (U) makes a new version instead of changing
tensors in place, so a micro-batch whose forward ran on an older version still finds
it in its backward. That is PipeDream's weight stashing
(Narayanan et al., SOSP 2019, section 3.3); flush schedules simply never use an old one.

Loss: the last stage's forward ends with ``mse(output, target) / g`` (the user's model: its own
loss ``/ g``) where ``g`` is
the number of micro-batches one update consumes (``M`` for flush schedules), so the
sum over the micro-batches of an update is the mean loss over its whole mini-batch.

Units: seconds for emulated costs, bytes for sizes. Data of micro-batch *m* is a
pure function of ``(seed, m)``, so a one-process reference sees the same numbers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from sim.model.cost import StageCosts
from sim.core.ir import OP_B, OP_F, OP_R, OP_U, OP_W, ActionKind

from validate.errors import WORKLOADS, WorkloadError
from validate.rank import user_model
from validate.request import WorkloadSpec

__all__ = ["WORKLOADS", "WorkloadSpec", "WorkloadError", "build_stage_module", "microbatch_data", "boundary_shape",
           "TorchStage", "EmulatedStage", "Sleeper", "make_stage_runtime", "initial_weights", "stage_loss",
           "user_stage_loss", "calibration_tensors", "RankSetup", "rank_setup"]

_INIT_LOCK = threading.Lock()


def build_stage_module(spec: WorkloadSpec, stage: int) -> nn.Module:
    """The module of *stage*, initialized from ``(seed, stage)``: the same on every process."""
    if spec.user:  # built once per process under torch.manual_seed(seed); a copy per call
        return user_model.stage_module(spec, stage)
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):  # the global RNG, held (threads of validate.rank.inprocess)
        torch.manual_seed(spec.seed * 7919 + stage)
        return _build(spec)


def _build(spec: WorkloadSpec) -> nn.Module:
    if spec.name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(spec.depth):
            layers += [nn.Linear(spec.width, spec.width), nn.GELU()]
        return nn.Sequential(*layers)
    if spec.name == "transformer":
        return nn.Sequential(*[
            nn.TransformerEncoderLayer(spec.d_model, spec.heads, dim_feedforward=4 * spec.d_model, dropout=0.0,
                                       batch_first=True)
            for _ in range(spec.depth)
        ])
    raise WorkloadError("the emulated workload has no stage modules")


def boundary_shape(spec: WorkloadSpec) -> tuple[int, ...]:
    """Shape of the tensor between two stages (activation and its gradient); built-in workloads, where every
    boundary has the same (the user's model: ``spec.boundaries[s]``, see :meth:`RankSetup.message_shape`)."""
    if spec.user:
        raise WorkloadError("the user's model has one shape per stage boundary: read spec.boundaries")
    if spec.name == "transformer":
        return (spec.batch, spec.seq, spec.d_model)
    return (spec.batch, spec.width)


@functools.lru_cache(maxsize=1024)
def microbatch_data(spec: WorkloadSpec, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of micro-batch *mb*; a pure function of (seed, mb).

    Cached, so the timed run does not pay for making its data (the warm-up makes it);
    callers must not modify the tensors in place.
    """
    if spec.user:
        return user_model.microbatch(spec, mb)
    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + 17 * mb + 1)
    shape = boundary_shape(spec)
    x = torch.randn(shape, generator=gen)
    target = torch.randn(shape, generator=gen)
    return x, target


def stage_loss(output: torch.Tensor, target: torch.Tensor, group: int) -> torch.Tensor:
    """Micro-batch loss scaled by 1/g: summed over an update's micro-batches it is the mini-batch mean."""
    return nn.functional.mse_loss(output, target) / group


def user_stage_loss(spec: WorkloadSpec, output: torch.Tensor, target: torch.Tensor, group: int) -> torch.Tensor:
    """:func:`stage_loss` of the user's model: its own loss (a micro-batch mean), scaled by 1/g the same way."""
    return user_model.loss_function(spec)(output, target) / group


def calibration_tensors(spec: WorkloadSpec, stage: int, last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(an input of *stage*, a gradient of its output or None on the last stage) to time the stage alone.

    Built-in workloads: random tensors of the boundary shape. The user's model: what *stage* gets from
    micro-batch 0 (its input may be token ids, which random floats are not), and a random gradient of
    the stage's output shape.
    """
    gen = torch.Generator().manual_seed(12345)
    if spec.user:
        x = user_model.stage_input(spec, stage)
        g = None if last else torch.randn(spec.boundaries[stage], generator=gen)
        return x, g
    shape = boundary_shape(spec)
    x = torch.randn(shape, generator=gen)
    return x, None if last else torch.randn(shape, generator=gen)


def initial_weights(module: nn.Module, device: torch.device) -> dict[str, nn.Parameter]:
    """Version 0 of a stage's weights: parameters (leaf tensors that require grad), copies of the module's."""
    return {k: nn.Parameter(v.detach().to(device).clone()) for k, v in module.named_parameters()}


def _shares_storage(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    return b is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _saved_bytes() -> tuple[list[int], object]:
    box = [0]

    def pack(t):
        box[0] += t.numel() * t.element_size()
        return t

    return box, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


@dataclass(slots=True)
class _Inflight:
    """What stage keeps for one micro-batch between F and its last backward action."""

    inputs: torch.Tensor
    version: int
    output: torch.Tensor | None = None  # output (or loss) with its graph; None while only the input is kept
    parts: list = field(default_factory=list)
    """(output, module path) of every parameter-owning submodule as the forward ran it (see :meth:`TorchStage.weight`)."""
    part_grads: tuple = ()
    """The gradient of each of those outputs, computed by a split B for its W."""


@dataclass(slots=True)
class TorchStage:
    """A real stage: F, B, W, R, U on a module, with weight versions (see module docstring)."""

    spec: WorkloadSpec
    stage: int
    last: bool
    group: int
    """g: micro-batches per update (the loss scale)."""
    module: nn.Module
    device: torch.device
    versions: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    current: int = 0
    grads: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """update group (mb // g) -> its accumulated gradient; U(u) applies group u's."""
    inflight: dict[int, _Inflight] = field(default_factory=dict)
    users: dict[int, int] = field(default_factory=dict)
    """version -> micro-batches in flight on it (old versions are dropped when it reaches 0)."""
    grad_log: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """The accumulated gradient each update applied (on the device; copied out after the run by :meth:`update_log`)."""
    weight_log: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """The weights after each update (the version tensors themselves: versions are never changed in place)."""
    activation_bytes: int = 0
    """Bytes saved for backward by the last forward (calibration)."""
    targets: dict[int, torch.Tensor] = field(default_factory=dict)
    """micro-batch -> its target on the device, prepared before the timed run (last stage)."""
    count_saved: bool = False
    """Count the bytes each forward saves for backward (:attr:`activation_bytes`): calibration only, it
    costs a Python call per saved tensor."""
    initial: dict[str, nn.Parameter] = field(default_factory=dict)
    """Version 0, kept apart: the module's own parameters are whichever version is bound."""
    bound: int | None = None
    """The version whose tensors are the module's parameters now (see :meth:`_bind`)."""
    _slots: dict[str, tuple[nn.Module, str]] = field(default_factory=dict)

    _capture: list | None = None
    _claims: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.module = self.module.to(self.device)
        self.initial = initial_weights(self.module, self.device)
        self._slots = {}
        for name in self.initial:
            owner, _, attr = name.rpartition(".")
            self._slots[name] = (self.module.get_submodule(owner), attr)
        # every module holding parameters (its own or its children's) reports its output while a forward
        # is captured; a split W takes each parameter's gradient from the smallest of them that ran
        self._claims = {}
        for path, sub in self.module.named_modules():
            names = [f"{path}.{n}" if path else n for n, _ in sub.named_parameters()]
            if names:
                self._claims[path] = names
                sub.register_forward_hook(functools.partial(self._captured, path))
        self.reset()

    def _captured(self, path: str, module, args, output) -> None:
        out = output[0] if isinstance(output, tuple) else output  # MultiheadAttention: (output, weights)
        if self._capture is not None and isinstance(out, torch.Tensor) and out.requires_grad:
            self._capture.append((out, path))

    def reset(self) -> None:
        self.versions = {0: {k: nn.Parameter(v.detach().clone()) for k, v in self.initial.items()}}
        self.bound = None
        self.current = 0
        self.grads = {}
        self.inflight.clear()
        self.users = {0: 0}
        self.grad_log = []
        self.weight_log = []

    # ---------------------------------------------------------------- F and R
    def _bind(self, version: int) -> None:
        """Make *version*'s tensors the module's parameters, so the module runs as is.

        A functional call (``torch.func.functional_call``) swaps every parameter in and out on each
        forward: 0.2 ms of a 1.8 ms forward of the benchmark's mlp stage, 5% of an iteration against
        PyTorch's runtime. Binding once per version costs that once per update in flush schedules
        (PipeDream's recomputes on older versions rebind). Versions are never changed in place, so a
        graph built on a version keeps its tensors whatever is bound later.
        """
        if self.bound != version:
            for name, tensor in self.versions[version].items():
                owner, attr = self._slots[name]
                setattr(owner, attr, tensor)
            self.bound = version

    def _run(self, version: int, x: torch.Tensor, mb: int, parts: list | None = None) -> torch.Tensor:
        self._bind(version)
        self._capture = parts
        try:
            out = self.module(x)
        finally:
            self._capture = None
        if self.last:
            target = self.targets.get(mb)
            if target is None:  # not prepared (calibration's micro-batches): made here, outside any timed run
                target = microbatch_data(self.spec, mb)[1].to(self.device)
            out = (user_stage_loss(self.spec, out, target, self.group) if self.spec.user
                   else stage_loss(out, target, self.group))
        return out

    def forward(self, mb: int, x: torch.Tensor, *, keep_graph: bool = True) -> torch.Tensor:
        """F: returns the activation to send (or the scaled loss on the last stage)."""
        x = x.detach().requires_grad_(self.stage > 0)
        version = self.current
        self.users[version] = self.users.get(version, 0) + 1
        if keep_graph:
            parts: list = []
            if self.count_saved:
                box, hooks = _saved_bytes()
                with hooks:
                    out = self._run(version, x, mb, parts)
                self.activation_bytes = box[0]
            else:
                out = self._run(version, x, mb, parts)
            self.inflight[mb] = _Inflight(x, version, out, parts)
        else:  # re-materialization: keep only the input; R rebuilds the graph
            with torch.no_grad():
                out = self._run(version, x, mb)
            self.inflight[mb] = _Inflight(x, version, None)
        return out.detach()

    def recompute(self, mb: int) -> None:
        """R: run the forward of *mb* again, under grad, on the weights its F used."""
        slot = self.inflight[mb]
        slot.parts = []
        slot.output = self._run(slot.version, slot.inputs, mb, slot.parts)

    # ---------------------------------------------------------------- B and W
    def backward(self, mb: int, grad_out: torch.Tensor | None, *, split: bool) -> torch.Tensor | None:
        """B: the input gradient (to send to the previous stage); *split*: leave the weight gradient to W.

        A split B also takes the gradient at the output of every parameter-holding submodule (one pass:
        the same chain of activation gradients the input gradient needs), so that W only has each
        module's own local step left, as zero-bubble runtimes do (Qi et al., ICLR 2024, section 2).
        Asking W for the weight gradients from the stage output instead repeats that whole chain:
        measured on the mlp stage, split B + W cost 61 ms against 49 ms unsplit.
        """
        slot = self.inflight[mb]
        params = self.versions[slot.version]
        wanted = [slot.inputs] if self.stage > 0 else []
        if split:
            wanted += [out for out, _ in slot.parts]
        else:
            wanted += list(params.values())
        grads = torch.autograd.grad(slot.output, wanted, grad_outputs=grad_out, retain_graph=split,
                                    allow_unused=True) if wanted else ()
        grad_in = grads[0] if self.stage > 0 else None
        if split:
            slot.part_grads = grads[len(grads) - len(slot.parts):]
        else:
            self._accumulate(mb, grads[len(grads) - len(params):], grad_out)
            self._release(mb)
        return grad_in

    def weight(self, mb: int) -> None:
        """W: the weight gradient of *mb*, each parameter's from the output gradient its B kept of the
        smallest module holding it that ran (a module that used a child's parameters without calling
        the child, as MultiheadAttention does with ``out_proj``, covers them; the whole stage covers the rest)."""
        slot = self.inflight[mb]
        params = self.versions[slot.version]
        owner: dict[str, str] = {}  # parameter -> the smallest module holding it that ran
        for path in {path for _, path in slot.parts}:
            for n in self._claims[path]:
                if n not in owner or len(self._claims[path]) < len(self._claims[owner[n]]):
                    owner[n] = path
        for (out, path), g in zip(slot.parts, slot.part_grads):  # a module run twice contributes twice
            names = [n for n in self._claims[path] if owner[n] == path]
            if g is None or not names:
                continue
            grads = torch.autograd.grad(out, [params[n] for n in names], grad_outputs=g, retain_graph=True,
                                        allow_unused=True)
            found = dict(zip(names, grads))
            self._accumulate(mb, [found.get(n) for n in params], g)
        self._release(mb)

    def _accumulate(self, mb: int, grads, aliased: torch.Tensor | None) -> None:
        """Add a micro-batch's weight gradients to its update group's; *aliased*: the output gradient given
        to autograd, which a returned gradient may share storage with (a parameter reaching the output as is)."""
        names = list(self.versions[self.current])
        acc = self.grads.setdefault(mb // self.group, {})
        for name, g in zip(names, grads):
            if g is None:
                continue
            if name in acc:
                acc[name].add_(g)
            elif _shares_storage(g, aliased):
                acc[name] = g.detach().clone()
            else:  # a fresh tensor from autograd: the accumulator owns it, no copy (a copy per parameter
                acc[name] = g.detach()  # per update was 1.5 ms of a 30 ms K=2 iteration against PyTorch's)

    def _release(self, mb: int) -> None:
        version = self.inflight.pop(mb).version
        self.users[version] -= 1
        if self.users[version] == 0 and version != self.current:
            del self.versions[version], self.users[version]

    # ---------------------------------------------------------------------- U
    def update(self, u: int) -> None:
        """U: SGD with the gradient of update group *u*; makes a new weight version."""
        old = self.versions[self.current]
        acc = self.grads.pop(u, {})
        step = {k: acc[k] if k in acc else torch.zeros_like(p) for k, p in old.items()}
        self.grad_log.append(step)  # kept on the device: no host synchronisation inside the timed run
        with torch.no_grad():  # p - lr * g in one pass (p - lr * g as written makes and reads a temporary)
            new = {k: nn.Parameter(torch.add(p, step[k], alpha=-self.spec.lr)) for k, p in old.items()}
        self.weight_log.append(new)
        if self.users.get(self.current, 0) == 0:
            del self.versions[self.current]
            self.users.pop(self.current, None)
        self.current += 1
        self.versions[self.current] = new
        self.users[self.current] = 0

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.versions[self.current].items()}

    def update_log(self) -> tuple[list[dict], list[dict]]:
        """(gradient applied, weights after) of every update, copied to the CPU; call after the run."""
        def out(log):
            return [{k: v.detach().cpu().clone() for k, v in entry.items()} for entry in log]
        return out(self.grad_log), out(self.weight_log)

    def weight_versions(self) -> int:
        return len(self.versions)


class Sleeper:
    """Waits until a deadline on the host: ``time.sleep`` for most of it, a spin for the end.

    ``time.sleep`` wakes late, by 0.05-0.2 ms on an idle Linux VM and by more when other
    processes hold the cores; +0.15 ms on a 20 ms action is +0.75% on every action, which
    misses a 2% target. Spinning for a fixed last millisecond fixed that but cost a core
    1 ms per action: with 4 ranks on 2 cores a spinning rank is preempted and the ranks it
    displaced start late (measured: mean +0.13 ms per action, worst +1 ms). So the sleep
    wakes early by the lateness this process has actually seen (the 90th percentile of the
    last 32 sleeps) and spins only that long.
    """

    WINDOW = 32
    FIRST_MARGIN = 1e-3
    """Seconds to wake early before any lateness was observed."""
    MAX_MARGIN = 2e-3
    """Never spin longer than this: lateness beyond it is contention, which spinning only worsens."""

    def __init__(self) -> None:
        self.late: deque[float] = deque(maxlen=self.WINDOW)

    def margin(self) -> float:
        if not self.late:
            return self.FIRST_MARGIN
        ordered = sorted(self.late)
        return min(self.MAX_MARGIN, ordered[int(0.9 * (len(ordered) - 1))])

    def until(self, deadline: float) -> None:
        rest = deadline - time.perf_counter() - self.margin()
        if rest > 0:
            asked = time.perf_counter() + rest
            time.sleep(rest)
            self.late.append(max(0.0, time.perf_counter() - asked))
        while time.perf_counter() < deadline:
            pass


@dataclass(slots=True)
class EmulatedStage:
    """An emulated stage: every action waits for its cost; sends are zero tensors of ``send_bytes``."""

    stage: int
    costs: StageCosts
    device: torch.device
    last: bool
    grad_log: list = field(default_factory=list)
    activation_bytes: int = 0
    sleeper: Sleeper = field(default_factory=Sleeper)
    inject: object = None
    """A :class:`validate.rank.inject.Injector` when the run injects variability (``--inject``), else None."""

    def _cost(self, seconds: float, kind: int, mb: int) -> float:
        """*seconds*, or the injected draw for this action (validate.rank.inject)."""
        return seconds if self.inject is None else self.inject.seconds(seconds, self.stage, kind, mb)

    def _wait(self, seconds: float, started: float | None = None) -> None:
        """Hold until *seconds* after *started* (default: now), precisely (see :class:`Sleeper`)."""
        self.sleeper.until((time.perf_counter() if started is None else started) + seconds)

    def _tensor(self, nbytes: float) -> torch.Tensor:
        return torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)

    def forward(self, mb: int, x, *, keep_graph: bool = True):
        started = time.perf_counter()
        out = self._tensor(self.costs.send_bytes[self.stage])  # inside the action's time, not after it
        self._wait(self._cost(self.costs.forward[self.stage], OP_F, mb), started)
        return out

    def recompute(self, mb: int) -> None:
        self._wait(self._cost(self.costs.recompute[self.stage], OP_R, mb))

    def backward(self, mb: int, grad_out, *, split: bool):
        started = time.perf_counter()
        out = self._tensor(self.costs.send_bytes[self.stage - 1]) if self.stage > 0 else None
        self._wait(self._cost(self.costs.cost(self.stage, ActionKind.B, split=split), OP_B, mb), started)
        return out

    def weight(self, mb: int) -> None:
        self._wait(self._cost(self.costs.weight[self.stage], OP_W, mb))

    def update(self, u: int) -> None:
        self._wait(self._cost(self.costs.update[self.stage], OP_U, u))

    def reset(self) -> None:
        if self.inject is not None:  # a run ended: the next one draws its own stragglers
            self.inject.next_run()

    def weights(self) -> dict:
        return {}

    def update_log(self) -> tuple[list, list]:
        return [], []

    def weight_versions(self) -> int:
        return 1


def make_stage_runtime(spec: WorkloadSpec, stage: int, *, stages: int, group: int, device: torch.device,
                       costs: StageCosts | None = None):
    """The runtime of *stage*: a :class:`TorchStage`, or an :class:`EmulatedStage` for ``emulated``."""
    last = stage == stages - 1
    if spec.name == "emulated":
        if costs is None:
            raise WorkloadError("the emulated workload needs costs: give --costs FILE (or use the default uniform costs)")
        return EmulatedStage(stage=stage, costs=costs, device=device, last=last)
    return TorchStage(spec=spec, stage=stage, last=last, group=group, module=build_stage_module(spec, stage),
                      device=device)


@dataclass(slots=True)
class RankSetup:
    """What the executor of one rank needs, shared by real runs (:mod:`validate.rank.worker`) and
    in-process runs (:mod:`validate.rank.inprocess`): the stage runtimes, the first stage's inputs
    and the shape of every message, all prepared on the device before anything is timed."""

    runtimes: dict
    """stage -> stage runtime of this rank."""
    prepared: dict[int, torch.Tensor]
    """micro-batch -> input of stage 0 on the device (when this rank holds stage 0)."""
    spec: WorkloadSpec
    costs: StageCosts | None
    stages: int

    def inputs(self, mb: int) -> torch.Tensor | None:
        return self.prepared.get(mb)

    def message_shape(self, producer: int) -> tuple[int, ...]:
        from sim.core.ir import boundary_stage
        if self.spec.user:
            return self.spec.boundaries[boundary_stage(producer, self.stages)]
        if self.spec.name != "emulated":
            return boundary_shape(self.spec)
        return (max(1, int(self.costs.send_bytes[boundary_stage(producer, self.stages)]) // 4),)


def rank_setup(spec: WorkloadSpec, schedule, rank: int, device: torch.device, costs: StageCosts | None = None, *,
               data_offset: int = 0, inject=None) -> RankSetup:
    """Build the stage runtimes of *rank* and move every input and target it will use to *device*.

    *data_offset*: micro-batch m of this pipeline uses the data of micro-batch ``data_offset + m``
    (the copies of a DP x PP run train on different data with the same initial weights).
    *inject*: the run's :class:`validate.request.InjectSpec` (``--inject``): emulated stages draw their waits
    (real stages are wrapped by the worker once measured: :func:`validate.rank.inject.inject_real`).
    """
    S = schedule.stages
    runtimes = {s: make_stage_runtime(spec, s, stages=S, group=schedule.microbatches_per_update, device=device,
                                      costs=costs) for s in schedule.stages_of(rank)}
    prepared = {}
    if spec.name != "emulated":
        for mb in range(schedule.total_microbatches):
            x, target = microbatch_data(spec, data_offset + mb)
            if 0 in runtimes:
                prepared[mb] = x.to(device)
            if S - 1 in runtimes:
                runtimes[S - 1].targets[mb] = target.to(device)
    if spec.name == "emulated" and inject is not None:
        from validate.rank.inject import attach_injectors  # --inject: the waits drawn from a distribution
        attach_injectors(runtimes, rank, schedule.devices, inject)
    return RankSetup(runtimes=runtimes, prepared=prepared, spec=spec, costs=costs, stages=S)
