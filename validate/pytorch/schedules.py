"""Which PyTorch schedule class runs a pipesim schedule name, and the order that class really executes.

Importable without torch; :func:`pytorch_schedule` imports it only for the multi-stage
classes (whose order is read from the class itself, :func:`sim.io.schedule_io.from_pytorch_class`).

The mapping is explicit (:data:`TORCH_CLASSES`): a pipesim name with no PyTorch class
(naive, PipeDream, 2BW, ZB-H1, ZB-H2) is refused with one line. Two PyTorch classes have no
pipesim generator and are reached by their own names (``looped-bfs``, ``interleaved-zb``).

What runs is not always what a class declares. The single-stage classes execute their own
loop (``_step_microbatches``), not their ``pipeline_order``:

- ``ScheduleGPipe``: every forward F0..F(M-1), then every backward B0..B(M-1) (in that order,
  where pipesim's ``gpipe`` generator runs the backwards last-in first-out);
- ``Schedule1F1B``: ``min(M, K - r)`` warm-up forwards on rank r, then alternately one backward
  and one forward, then the remaining backwards. torch 2.13's ``Schedule1F1B._get_pipeline_order``
  numbers the last rank's forwards from 1 (F1..FM, no F0): a defect of the declared order only.

So for these two, the schedule compared is the executed loop (:func:`executed_order`), and a
declared order that differs is reported; the multi-stage classes run their ``pipeline_order``
through ``_PipelineScheduleRuntime`` and are compared against it.

Any other order (a synthesized schedule, a saved file: ``pipesim validate --runtime torch --schedule-file FILE``)
runs in PyTorch's ``_PipelineScheduleRuntime``, loaded from PyTorch's compute-only CSV with its ``_load_csv``: the
one way PyTorch runs an arbitrary order (torch 2.13, ``torch/distributed/pipelining/schedules.py``: ``_load_csv``
parses the CSV, ``_validate_schedule`` checks it, ``_load_actions`` adds the sends and receives). Both names are
private, so :func:`private_runtime` checks them in the rank and refuses with one line where a torch lacks them
(a test pins them on the installed torch).
"""

from __future__ import annotations

import re

from sim.errors import PipesimError
from sim.core.ir import Action, ActionKind, Schedule

__all__ = ["TORCH_CLASSES", "UnsupportedScheduleError", "torch_class_for", "pytorch_schedule", "executed_order",
           "SINGLE_STAGE", "RUNTIME_CLASS", "schedule_file_plan", "schedule_file_key", "schedule_file_name",
           "private_runtime",
           "torch_schedule"]

RUNTIME_CLASS = "_PipelineScheduleRuntime"
"""PyTorch's runtime of arbitrary orders (private; torch.distributed.pipelining.schedules)."""

TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
"""pipesim schedule name -> PyTorch class (torch.distributed.pipelining, torch 2.13)."""

SINGLE_STAGE = ("ScheduleGPipe", "Schedule1F1B")
V_SHAPED = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")


class UnsupportedScheduleError(PipesimError):
    """A schedule PyTorch has no class for."""


def torch_class_for(name: str) -> str:
    """The PyTorch class of pipesim schedule *name* (or of a PyTorch class name, with or without 'Schedule')."""
    key = name.strip().lower()
    if key in TORCH_CLASSES:
        return TORCH_CLASSES[key]
    for cls in TORCH_CLASSES.values():
        if key in (cls.lower(), cls.lower().removeprefix("schedule")):
            return cls
    known = ", ".join(f"{k} ({v})" for k, v in TORCH_CLASSES.items())
    raise UnsupportedScheduleError(f"PyTorch has no schedule class for {name!r}; the torch runtime runs: {known}")


def executed_order(cls: str, devices: int, microbatches: int) -> Schedule:
    """What ``_step_microbatches`` of single-stage class *cls* runs on every rank (module docstring)."""
    K, M = devices, microbatches
    F = lambda s, m: Action(s, ActionKind.F, m)  # noqa: E731
    B = lambda s, m: Action(s, ActionKind.B, m)  # noqa: E731
    actions = {}
    for r in range(K):
        if cls == "ScheduleGPipe":
            actions[r] = [F(r, m) for m in range(M)] + [B(r, m) for m in range(M)]
            continue
        if cls != "Schedule1F1B":
            raise UnsupportedScheduleError(f"{cls} is not a single-stage class")
        if M < K:
            raise UnsupportedScheduleError(f"Schedule1F1B needs at least as many micro-batches as stages "
                                           f"(M={M} < K={K})")
        warmup = min(M, K - r)
        acts = [F(r, m) for m in range(warmup)]
        fwd, bwd = warmup, 0
        while True:
            acts.append(B(r, bwd))
            bwd += 1
            if fwd == M:
                break
            acts.append(F(r, fwd))
            fwd += 1
        acts += [B(r, m) for m in range(bwd, M)]
        actions[r] = acts
    return Schedule.build(name=f"pytorch-{cls}", devices=K, microbatches=M, actions=actions).validate()


def pytorch_schedule(cls: str, devices: int, microbatches: int, *, chunks: int | None = None) -> tuple[Schedule, list[str]]:
    """The schedule PyTorch's *cls* executes on *devices* ranks with *microbatches*, without U; and notes."""
    from sim.io.schedule_io import PyTorchFormatError, from_pytorch_class

    from validate.ingest.flow import without_updates

    notes: list[str] = []
    short = cls.removeprefix("Schedule")
    if cls in SINGLE_STAGE:
        executed = executed_order(cls, devices, microbatches)
        try:
            declared = without_updates(from_pytorch_class(short, devices, microbatches))
        except PyTorchFormatError as exc:
            notes.append(f"{cls}'s declared pipeline_order cannot run ({str(exc).splitlines()[0]}; torch 2.13 numbers "
                         f"the last rank's forwards from 1): compared against what its runtime executes "
                         f"(_step_microbatches)")
        else:
            if any(declared.actions[d] != executed.actions[d] for d in range(devices)):
                notes.append(f"{cls}'s declared pipeline_order differs from what its runtime executes; compared "
                             f"against the executed order")
        return executed, notes
    chunks = 2 if cls in V_SHAPED else (chunks or 2)
    try:
        schedule = from_pytorch_class(short, devices, microbatches, chunks=chunks)
    except PyTorchFormatError as exc:
        raise UnsupportedScheduleError(f"{cls} with K={devices}, M={microbatches}, {chunks} chunks: "
                                       f"{str(exc).splitlines()[0]}") from None
    except ValueError as exc:  # PyTorch's own constructor refusing the shape
        raise UnsupportedScheduleError(f"{cls} refuses K={devices}, M={microbatches}, {chunks} chunks: {exc}") from None
    return without_updates(schedule), notes


def schedule_file_plan(path: str, devices: int | None = None) -> tuple[Schedule, str, list[str]]:
    """What ``--runtime torch --schedule-file PATH`` runs: the schedule read from *path* (pipesim's ``.json`` /
    ``.txt`` or PyTorch's ``.csv``, :func:`sim.io.schedule_io.read_schedule_file`) without its updates (PyTorch's
    runtime leaves the optimizer to the caller), the compute-only CSV PyTorch loads, and notes. Refused with one
    line: what PyTorch's CSV cannot express (recompute, several iterations), and a file whose number of ranks is
    not *devices* (when given)."""
    import csv
    import io

    from sim.io.schedule_io import PyTorchFormatError, pytorch_rows, read_schedule_file

    from validate.ingest.flow import without_updates

    schedule = read_schedule_file(path)
    if devices is not None and schedule.devices != devices:
        raise UnsupportedScheduleError(f"{path} is a schedule of {schedule.devices} ranks; the run has {devices} "
                                       f"(the file fixes its own shape)")
    try:
        rows = pytorch_rows(schedule)  # refuses what the CSV cannot say: recompute, several iterations
    except PyTorchFormatError as exc:
        raise UnsupportedScheduleError(f"{path}: {exc}; the torch runtime cannot run it (use --runtime pipesim)") \
            from None
    bare = without_updates(schedule)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    text = buffer.getvalue()
    notes = [f"the order of {path} ({schedule.name}) run by PyTorch's {RUNTIME_CLASS} from its compute-only CSV "
             f"(_load_csv)"]
    return bare, text, notes


def schedule_file_key(path: str) -> tuple[str, str]:
    """The name the reports of ``--schedule-file PATH`` carry, and the SHA-256 of the file's bytes.

    The name is the file's name with every character other than a letter, digit, ``_`` or ``-`` made ``-``
    (``zb2p.csv`` -> ``zb2p-csv``; at most 48 characters), then the first 8 hex digits of that digest: two files
    with the same K, M and workload written to one ``-o`` folder never share a report (``runs1/a.csv`` and
    ``runs2/a.csv``, ``a.csv`` and ``a.json`` included), and the same file always gets the same name, so running it
    again replaces its own report and nothing else's."""
    import hashlib
    from pathlib import Path

    from sim.io.schedule_io import PyTorchFormatError

    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:  # read a moment ago by schedule_file_plan; gone or unreadable since
        raise PyTorchFormatError(f"schedule file {path}: cannot read it: {exc.strerror or exc}") from None
    return schedule_file_name(path, digest), digest


def schedule_file_name(path: str, digest: str) -> str:
    """:func:`schedule_file_key`'s name of the file *path* whose bytes have SHA-256 *digest* (hex)."""
    from pathlib import Path

    readable = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9_-]", "-", Path(path).name)).strip("-")[:48].strip("-")
    return f"{readable or 'schedule'}-{digest[:8]}"


def private_runtime():
    """PyTorch's ``_PipelineScheduleRuntime`` class, checked to have the ``_load_csv(filename, format)`` this module
    calls (torch needed; rank side). A torch without them is one line, :class:`UnsupportedScheduleError`."""
    import inspect

    import torch
    try:
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime as runtime
        params = inspect.signature(runtime._load_csv).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        runtime, params = None, {}
    if runtime is None or "format" not in params:
        raise UnsupportedScheduleError(f"torch {torch.__version__} has no {RUNTIME_CLASS}._load_csv(filename, "
                                       f"format) (a private API, present in torch 2.6-2.13); --runtime torch cannot "
                                       f"run a schedule file with it: use --runtime pipesim")
    return runtime


def torch_schedule(job: dict, stages: list, microbatches: int, loss, workdir: str, rank: int):
    """The PyTorch schedule object of *job* (rank side, torch needed): its public class by name
    (``job["cls"]``), or, for a schedule file (``job["csv"]``: the compute-only CSV text), PyTorch's runtime with
    that CSV loaded. *stages*: this rank's ``PipelineStage`` objects; *loss*: the loss function."""
    from torch.distributed import pipelining

    if "csv" not in job:
        cls = getattr(pipelining, job["cls"])
        return cls(stages[0] if job["cls"] in SINGLE_STAGE else stages, microbatches, loss_fn=loss)
    runtime = private_runtime()(stages, microbatches, loss_fn=loss)
    from pathlib import Path

    from sim.files import atomic_path

    path = Path(workdir) / f"{job['name']}_rank{rank}_schedule.csv"
    with atomic_path(path) as part:  # _load_csv reads a path: never a half-written one
        part.write_text(job["csv"])
    runtime._load_csv(str(path), format="compute_only")
    return runtime
