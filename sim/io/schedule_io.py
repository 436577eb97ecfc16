"""Schedules in PyTorch's format, both ways: its schedule CSV and its schedule classes.

PyTorch (``torch.distributed.pipelining``) stores a schedule as a CSV with one row
per rank and one cell per step; a cell is an action such as ``0F0`` (stage 0,
forward, micro-batch 0), ``1I3`` (input gradient), ``1W3`` (weight gradient) or
``2B0`` (full backward), and an empty cell is an idle step. Which letter means what
changed between releases (the *dialect*):

============  ====================  =========================================
dialect       ``B``                 input gradient only
============  ====================  =========================================
``"2.6"``     full backward          ``I`` (with a later ``W``)
``"2.5"``     backward; input        (no ``I``; ``B`` is input-only when the
              gradient only when a   same stage and micro-batch has a ``W``)
              ``W`` follows
============  ====================  =========================================

``"2.6"`` (torch 2.6 and later) is the default. Both map onto our IR, where ``B``
is the full backward unless the schedule also has a ``W`` for the same stage and
micro-batch. torch 2.5 also writes ``BW`` for a full backward (its ``FULL_BACKWARD``); a file
holding a ``BW`` cell is a 2.5 file whatever dialect is asked for, and is read as one. Cells our IR has no use for are skipped: communication
(``SEND_F``, ``RECV_B``, ...; our engine derives transfers from the placement), 2.5's
combined send/receive cells (``0SEND_F0_2RECV_B0``, ``SEND_F_RECV_B`` / ``SEND_B_RECV_F``),
FSDP ``UNSHARD``/``RESHARD`` and ``REDUCE_GRAD``. An overlapped pair
``(0F7;7B3)OVERLAP_F_B`` becomes its two actions run as one unit (``Schedule.overlapped``),
and is written back the same way.

Sizes are checked before anything is allocated: a one-cell file such as ``99999999F0`` or
``0F99999999`` cannot run (its stages or micro-batches would need actions the file lacks) and
is refused at once, with a short message, instead of building tables for 10^8 stages.

Import derives the placement (stage -> the rank whose row holds its actions) and,
because PyTorch's CSV has no optimizer step, adds one ``U`` per stage at the end of
its rank's row (flush semantics, one iteration), then validates. Export writes the
reverse; it refuses what PyTorch's runtime cannot express (several iterations,
several updates per stage, recompute actions).

No torch import happens here unless :func:`from_pytorch_class` is called.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from sim.core.comm_lowering import STEP_COMPUTE, STEP_POST
from sim.core.ir import Action, ActionKind, Schedule, ScheduleError
from sim.errors import PipesimError, quote
from sim.files import read_json, read_text, write_text

__all__ = ["lowered_rows", "write_lowered_csv",
           "DIALECTS", "PyTorchFormatError", "DialectError", "parse_cell", "schedule_from_rows", "read_pytorch_csv",
           "pytorch_rows", "write_pytorch_csv", "to_json", "from_json", "read_schedule_file",
           "write_schedule_file", "from_pytorch_class", "dialect_of", "PYTORCH_V_SHAPED", "EXPORT_FORMATS"]

DIALECTS = ("2.6", "2.5")
"""torch_version dialects of the CSV letters (see the module docstring)."""

EXPORT_FORMATS = ("pytorch-csv", "text", "json")

PYTORCH_V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
"""PyTorch schedule classes that place stages as a V (stage s and 2K-1-s on rank s)."""

_CELL_RE = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")
_SKIPPED = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"}
_OVERLAP_RE = re.compile(r"^\((.*)\)OVERLAP_F_B$")
# torch 2.5's batched send/receive pair, e.g. 0SEND_F0_2RECV_B0 (_Action.__repr__ of SEND_F_RECV_B / SEND_B_RECV_F)
_COMBINED_RE = re.compile(r"^\d+(SEND_F|SEND_B)\d+_\d+(RECV_B|RECV_F)\d+$")
_BW_RE = re.compile(r"^\s*\d+BW\d+\s*$")
_MAX_INDEX = 10**9
"""Largest stage or micro-batch index a cell may carry: far above any real schedule, and it keeps a
cell such as ``0F99999...9`` from reaching int() with thousands of digits."""


class PyTorchFormatError(PipesimError):
    """A PyTorch schedule (CSV cell, file or class) that cannot be turned into our IR, or back."""


class DialectError(PyTorchFormatError):
    """A file read in the wrong letter dialect. The message names the Python argument (``torch_version='2.5'``);
    :meth:`for_cli` gives the same advice naming the command-line flag (``--torch-version 2.5``)."""

    def __init__(self, template: str, dialect: str) -> None:
        self.template, self.dialect = template, dialect
        super().__init__(template.format(fix=f"torch_version={dialect!r}"))

    def for_cli(self) -> PyTorchFormatError:
        return PyTorchFormatError(self.template.format(fix=f"--torch-version {self.dialect}"))


def _check_dialect(torch_version: str) -> str:
    if torch_version not in DIALECTS:
        raise PyTorchFormatError(f"unknown torch_version dialect {torch_version!r}; use one of {', '.join(DIALECTS)} "
                                 f"('2.6': I = input gradient, B = full backward; '2.5': B = backward, no I)")
    return torch_version


def parse_cell(text: str, *, torch_version: str = "2.6") -> list[tuple[int, str, int]]:
    """One CSV cell -> ``[(stage, letter, micro-batch)]`` of computations (empty for idle or skipped cells).

    *letter* is one of F, B (input-gradient only if a W of the same stage and micro-batch exists), W,
    or ``"full"`` for the 2.6 dialect's full backward (B)."""
    _check_dialect(torch_version)
    text = text.strip()
    if not text or text == "None" or _COMBINED_RE.match(text):  # idle, or 2.5's combined send/receive
        return []
    overlap = _OVERLAP_RE.match(text)
    if overlap:
        parts = overlap[1].split(";")
        if any(_OVERLAP_RE.match(part.strip()) for part in parts):  # PyTorch never nests them; nor do we recurse
            raise PyTorchFormatError(f"PyTorch action {quote(text)}: an OVERLAP_F_B pair cannot hold another")
        return [a for part in parts for a in parse_cell(part, torch_version=torch_version)]
    match = _CELL_RE.match(text)
    if match is None:
        raise PyTorchFormatError(f"cannot parse PyTorch action {quote(text)}: expected <stage><type><micro-batch>, "
                                 f"e.g. 0F0, 1I3, 2B0")
    if len(match[1]) > 10 or len(match[3]) > 10 or int(match[1]) > _MAX_INDEX or int(match[3] or 0) > _MAX_INDEX:
        raise PyTorchFormatError(f"PyTorch action {quote(text)}: stage or micro-batch index above {_MAX_INDEX}")
    stage, kind, mb = int(match[1]), match[2], match[3]
    if kind in _SKIPPED:
        return []
    if not mb:
        raise PyTorchFormatError(f"PyTorch action {quote(text)} has no micro-batch index")
    if kind == "I":
        if torch_version == "2.5":
            raise DialectError(f"{text!r}: 'I' does not exist in the 2.5 dialect; read the file with {{fix}}", "2.6")
        return [(stage, "B", int(mb))]
    if kind == "BW":  # torch 2.5's FULL_BACKWARD; later releases write B for it
        return [(stage, "full", int(mb))]
    if kind == "B":
        return [(stage, "full" if torch_version == "2.6" else "B", int(mb))]
    if kind in ("F", "W"):
        return [(stage, kind, int(mb))]
    raise PyTorchFormatError(f"PyTorch action {quote(text)}: type {quote(kind)} has no counterpart in our IR "
                             f"(F, I, B, BW, W and the skipped communication / sharding types are understood)")


def schedule_from_rows(rows: Sequence[Sequence[str]], *, torch_version: str = "2.6", name: str = "pytorch",
                       microbatches: int | None = None) -> Schedule:
    """PyTorch's per-rank rows of cells -> a validated :class:`Schedule` (one iteration, U added per stage)."""
    if torch_version == "2.6" and any(_BW_RE.match(cell) for row in rows for cell in row):
        torch_version = "2.5"  # BW (FULL_BACKWARD) exists only in torch <= 2.5 files: there, B is the input gradient
    parsed = [[a for cell in row for a in parse_cell(cell, torch_version=torch_version)] for row in rows]
    if not any(parsed):
        raise PyTorchFormatError("the PyTorch schedule has no computations: expected rows like '0F0,0F1,,0B0'")
    devices = len(parsed)
    stages = 1 + max(s for row in parsed for s, _, _ in row)
    placement: dict[int, int] = {}
    for rank, row in enumerate(parsed):
        for stage, _, _ in row:
            if placement.setdefault(stage, rank) != rank:
                raise PyTorchFormatError(f"stage {stage} has actions on ranks {placement[stage]} and {rank}; "
                                         f"a stage must live on one rank")
    if len(placement) < stages:  # examples from the first stages only: the largest index may be 10^9
        missing = [s for s in range(min(stages, len(placement) + 8)) if s not in placement]
        raise PyTorchFormatError(f"{stages - len(placement)} stage(s) have no actions, e.g. {missing}; stages must "
                                 f"be numbered 0..{stages - 1} without gaps")
    computations = sum(len(row) for row in parsed)
    M = microbatches or 1 + max(mb for row in parsed for _, _, mb in row)
    if 2 * stages * M > computations:  # checked before any table of stages or micro-batches is built
        raise PyTorchFormatError(
            f"the PyTorch schedule has {computations} computation(s), but {stages} stage(s) x {M} micro-batch(es) "
            f"need at least {2 * stages * M} (a forward and a backward of each); micro-batches must be "
            f"numbered 0..M-1 without gaps")
    split = {(s, mb) for row in parsed for s, k, mb in row if k == "W"}
    overlapped = []  # (row, index in its parsed row) of each OVERLAP_F_B cell's forward: the pair runs as one unit
    for rank, row in enumerate(rows):
        at = 0
        for cell in row:
            parts = parse_cell(cell, torch_version=torch_version)
            if _OVERLAP_RE.match(cell.strip()) and [k for _, k, _ in parts] in (["F", "full"], ["F", "B"]):
                overlapped.append((rank, at))
            at += len(parts)
    actions: dict[int, list[Action]] = {}
    for rank, row in enumerate(parsed):
        out = []
        for stage, kind, mb in row:
            if kind == "full" and (stage, mb) in split:
                raise DialectError(f"{stage}B{mb} is a full backward (dialect {torch_version}) but {stage}W{mb} "
                                   f"also exists; use {stage}I{mb} for the input gradient, or read the file "
                                   f"with {{fix}}", "2.5")
            if kind == "B" and torch_version == "2.6" and (stage, mb) not in split:
                raise PyTorchFormatError(f"{stage}I{mb} computes only the input gradient but {stage}W{mb} is missing")
            out.append(Action(stage, ActionKind.B if kind == "full" else ActionKind(kind), mb))
        out += [Action(s, ActionKind.U, 0) for s in sorted(s for s, r in placement.items() if r == rank)]
        actions[rank] = out
    try:
        return Schedule.build(name=name, devices=devices, microbatches=M, iterations=1,
                              placement=[placement[s] for s in range(stages)], actions=actions,
                              overlapped=[tuple(actions[r][i:i + 2]) for r, i in overlapped]).validate()
    except ScheduleError as exc:
        raise PyTorchFormatError(f"the imported PyTorch schedule cannot run: {exc}") from None


def read_pytorch_csv(source: str | Path, *, torch_version: str = "2.6", name: str | None = None,
                     microbatches: int | None = None) -> Schedule:
    """Read PyTorch's schedule CSV (a path) into a validated schedule."""
    path = Path(source)
    text = read_text(path, what="schedule file", error=PyTorchFormatError)  # UTF-8, BOM or not; names the file
    try:
        rows = [row for row in csv.reader(io.StringIO(text, newline=""))
                if not (row and row[0].lstrip().startswith("#"))]
    except csv.Error as exc:  # e.g. a cell longer than csv's field limit (128 KiB)
        raise PyTorchFormatError(f"schedule file {quote(str(path), 200)} is not a readable CSV: {exc}") from None
    if not rows:
        raise PyTorchFormatError(f"schedule file {quote(str(path), 200)} is empty; expected one row of actions per "
                                 f"rank, e.g. '0F0,0F1,,0B0'")
    return schedule_from_rows(rows, torch_version=torch_version, name=name or path.stem, microbatches=microbatches)


def pytorch_rows(schedule: Schedule, *, torch_version: str = "2.6") -> list[list[str]]:
    """Our schedule -> PyTorch's rows of cells (one row per rank, no idle cells; U dropped)."""
    _check_dialect(torch_version)
    if schedule.iterations != 1 or schedule.updates_per_stage > 1:
        raise PyTorchFormatError(f"PyTorch's CSV describes one iteration with one optimizer step per stage; schedule "
                                 f"{schedule.name!r} has {schedule.iterations} iteration(s) and "
                                 f"{schedule.updates_per_stage} update(s) per stage: export with --iterations 1 and "
                                 f"a flush schedule, or use --format text / json")
    if schedule.recomputed:
        raise PyTorchFormatError("PyTorch's CSV has no recompute action (it checkpoints inside the stage module); "
                                 "export without --recompute")
    split = schedule.split_backward
    pairs = dict(schedule.overlapped)  # forward -> the backward it runs with, written as one OVERLAP_F_B cell
    rows = []
    for device in range(schedule.devices):
        row = []
        for a in schedule.actions[device]:
            if a.kind is ActionKind.U:
                continue
            letter = a.kind.value
            if a.kind is ActionKind.B and (a.stage, a.mb) in split and torch_version == "2.6":
                letter = "I"
            row.append(f"{a.stage}{letter}{a.mb}")
        rows.append(_fuse_cells(row, schedule.actions[device], pairs))
    return rows


def _fuse_cells(row: list[str], actions: Sequence[Action], pairs: Mapping[Action, Action]) -> list[str]:
    """Write each overlapped pair (consecutive cells) as PyTorch's ``(F;B)OVERLAP_F_B`` cell."""
    computed = [a for a in actions if a.kind is not ActionKind.U]  # the actions behind *row*, cell by cell
    out, i = [], 0
    while i < len(row):
        if computed[i] in pairs and i + 1 < len(row) and computed[i + 1] == pairs[computed[i]]:
            out.append(f"({row[i]};{row[i + 1]})OVERLAP_F_B")
            i += 2
        else:
            out.append(row[i])
            i += 1
    return out


def write_pytorch_csv(schedule: Schedule, path: str | Path, *, torch_version: str = "2.6") -> Path:
    """Write PyTorch's CSV (loadable by ``_PipelineScheduleRuntime._load_csv``)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(pytorch_rows(schedule, torch_version=torch_version))
    return write_text(path, buffer.getvalue())


def to_json(schedule: Schedule) -> dict:
    """Our schedule as plain JSON data (everything it holds, U and R included)."""
    return {"name": schedule.name, "devices": schedule.devices, "stages": schedule.stages,
            "microbatches": schedule.microbatches, "iterations": schedule.iterations,
            "placement": list(schedule.placement),
            "actions": {str(d): [str(a) for a in schedule.actions[d]] for d in range(schedule.devices)},
            "overlapped": [[str(f), str(b)] for f, b in schedule.overlapped]}


def from_json(data: Mapping) -> Schedule:
    """pipesim's schedule JSON (as :func:`to_json` writes it) -> a validated schedule. Types and sizes are
    checked before anything is built: ``"microbatches": 3e9`` is refused at once, not after filling memory."""
    if not isinstance(data, Mapping):
        raise PyTorchFormatError(f"a pipesim schedule JSON is an object with devices, microbatches, placement and "
                                 f"actions; got {type(data).__name__}")
    missing = [k for k in ("devices", "microbatches", "actions") if k not in data]
    if missing:
        raise PyTorchFormatError(f"not a pipesim schedule JSON: it lacks {missing} (needs devices, microbatches, "
                                 f"placement, actions; see pipesim export --format json)")
    shape = {}
    for key, default in (("devices", None), ("microbatches", None), ("iterations", 1)):
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PyTorchFormatError(f"schedule JSON: {key} must be a positive whole number, got {quote(value)}")
        shape[key] = value
    acts, placement = data["actions"], data.get("placement")
    if not isinstance(acts, Mapping) or not all(isinstance(v, list) for v in acts.values()):
        raise PyTorchFormatError("schedule JSON: actions must map each device to a list of actions like '0F0'")
    if placement is not None and (not isinstance(placement, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in placement)):
        raise PyTorchFormatError("schedule JSON: placement must be a list of device numbers, one per stage")
    stages = len(placement) if placement is not None else shape["devices"]
    count = sum(len(v) for v in acts.values())
    need = 2 * stages * shape["microbatches"] * shape["iterations"]
    if need > count or shape["devices"] > max(count, 1):  # before any table of that size is built
        raise PyTorchFormatError(
            f"schedule JSON: {shape['devices']} device(s), {stages} stage(s) and {shape['microbatches']} "
            f"micro-batch(es) x {shape['iterations']} iteration(s) need at least {need} actions (a forward and a "
            f"backward of each) but the file lists {count}")
    try:
        devices = {}
        for d, cells in acts.items():
            if not isinstance(d, str) or not d.isdigit() or len(d) > 10:
                raise PyTorchFormatError(f"schedule JSON: device key {quote(d)} is not a device number")
            parsed = []
            for a in cells:
                if not isinstance(a, str) or len(a) > 40:
                    raise PyTorchFormatError(f"schedule JSON: {quote(a)} is not an action like '0F0'")
                parsed.append(Action.parse(a))
            devices[int(d)] = parsed
        pairs = data.get("overlapped", [])
        if not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(a, str) and len(a) <= 40 for a in p)
                for p in pairs):
            raise PyTorchFormatError("schedule JSON: overlapped must be a list of [forward, backward] pairs like "
                                     "['0F7', '7B3']")
        return Schedule.build(name=str(data.get("name", "schedule")), devices=shape["devices"],
                              microbatches=shape["microbatches"], iterations=shape["iterations"],
                              placement=placement, actions=devices,
                              overlapped=[tuple(map(Action.parse, pair)) for pair in pairs]).validate()
    except ScheduleError as exc:
        raise PyTorchFormatError(f"schedule JSON: {exc}") from None


def write_schedule_file(schedule: Schedule, path: str | Path, fmt: str, *, torch_version: str = "2.6") -> Path:
    """Write *schedule* as ``pytorch-csv``, ``text`` (one line per device) or ``json`` (atomically)."""
    if fmt == "pytorch-csv":
        return write_pytorch_csv(schedule, path, torch_version=torch_version)
    if fmt == "json":
        return write_text(path, json.dumps(to_json(schedule), indent=1) + "\n")
    if fmt == "text":
        header = (f"# {schedule.name}: K={schedule.devices} S={schedule.stages} M={schedule.microbatches} "
                  f"iterations={schedule.iterations} placement={','.join(map(str, schedule.placement))}\n")
        return write_text(path, header + schedule.to_text() + "\n")
    raise PyTorchFormatError(f"unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")


def read_schedule_file(path: str | Path, *, torch_version: str = "2.6") -> Schedule:
    """A schedule file by suffix: ``.csv`` (PyTorch's format), ``.json`` (ours, as written by export) or ``.txt``
    (ours, as ``synthesize -o`` / :func:`write_schedule_file` writes it: a ``# name: K= S= M= iterations=
    placement=`` header, then one ``device: actions`` line per device)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return read_pytorch_csv(path, torch_version=torch_version)
    name = quote(str(path), 200)
    if suffix == ".json":
        data = read_json(path, what="schedule file", error=PyTorchFormatError,
                         expected="pipesim's schedule JSON (write one with: pipesim export --format json)")
        try:
            return from_json(data)
        except PyTorchFormatError as exc:
            raise PyTorchFormatError(f"schedule file {name}: {exc}") from None
    if suffix == ".txt":
        try:
            return from_json(_text_as_json(read_text(path, what="schedule file", error=PyTorchFormatError)))
        except PyTorchFormatError as exc:
            raise PyTorchFormatError(f"schedule file {name}: {exc}") from None
    raise PyTorchFormatError(f"cannot read a schedule from {quote(str(path), 200)}: use PyTorch's .csv or "
                             f"pipesim's .json or .txt")


_TEXT_HEADER = re.compile(r"#\s*(?P<name>[^:]*):\s*K=(?P<K>\d{1,9})\s+S=(?P<S>\d{1,9})\s+M=(?P<M>\d{1,9})\s+"
                          r"iterations=(?P<it>\d{1,9})\s+placement=(?P<placement>[\d,]*)\s*$")


def _text_as_json(text: str) -> dict:
    """The text format (:func:`write_schedule_file` ``"text"``) as the mapping :func:`from_json` checks and builds:
    one set of checks for both of pipesim's formats. An overlapped pair reads ``(0F7;7B3)``."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    header = _TEXT_HEADER.match(lines[0]) if lines else None
    if header is None:
        raise PyTorchFormatError("a pipesim schedule text starts with '# NAME: K=.. S=.. M=.. iterations=.. "
                                 "placement=0,1,..' (as synthesize -o FILE.txt writes it)")
    actions, pairs = {}, []
    for ln in lines[1:]:
        if ln.startswith("#"):
            continue
        device, sep, cells = ln.partition(":")
        if not sep or not device.strip().isdigit():
            raise PyTorchFormatError(f"line {quote(ln, 60)} is not 'DEVICE: ACTION ACTION ...'")
        row = []
        for cell in cells.split():
            if cell.startswith("(") and cell.endswith(")") and ";" in cell:
                pair = cell[1:-1].split(";")
                row += pair
                pairs.append(pair)
            else:
                row.append(cell)
        actions[device.strip()] = row
    placement = [int(d) for d in header["placement"].split(",") if d]
    if len(placement) != int(header["S"]):
        raise PyTorchFormatError(f"the header says S={header['S']} but its placement names {len(placement)} stages")
    return {"name": header["name"].strip() or "schedule", "devices": int(header["K"]),
            "microbatches": int(header["M"]), "iterations": int(header["it"]), "placement": placement,
            "actions": actions, "overlapped": pairs}


# ------------------------------------------------------------------ torch's own classes
def dialect_of(version: str) -> str:
    """The CSV dialect a torch release writes: ``"2.5"`` up to torch 2.5, ``"2.6"`` from 2.6 on."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise PyTorchFormatError(f"cannot read the torch version {version!r}; pass the dialect explicitly")
    return "2.5" if (int(match[1]), int(match[2])) < (2, 6) else "2.6"


class _StandInStage:
    """The few attributes PyTorch's schedule constructors read from a pipeline stage (no model, no process group)."""

    def __init__(self, stage_index: int, num_stages: int, rank: int, group_size: int) -> None:
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = group_size
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = None  # the torch.compile check skips stages without a module
        self.stage_index_to_group_rank: dict[int, int] = {}


def from_pytorch_class(name: str, devices: int, microbatches: int, *, chunks: int = 2) -> Schedule:
    """Build PyTorch's schedule class *name* (as ``get_schedule_class`` knows it) and import its order.

    Uses only the public API of the installed torch: ``get_schedule_class``, the
    class constructors and their ``pipeline_order``, with stand-in stage objects in
    place of real stages (no GPU, no process group). Multi-stage classes get *chunks*
    stages per rank (V-shaped classes always two).
    """
    try:
        import torch
        from torch.distributed.pipelining import schedules as torch_schedules
    except ImportError as exc:
        raise PyTorchFormatError(f"--from-pytorch needs torch (pip install 'pipesim[validate]'): {exc}") from None
    version = torch.__version__.split("+")[0]
    get = getattr(torch_schedules, "get_schedule_class", None)
    if get is None:
        raise PyTorchFormatError(f"torch {version} has no get_schedule_class; use torch >= 2.5, or export the "
                                 f"schedule to CSV with PyTorch and pass --schedule-file")
    try:
        cls = get(name)
    except ValueError as exc:
        raise PyTorchFormatError(f"torch {version}: {exc}") from None
    cls_name = cls.__name__
    multi = not issubclass(cls, torch_schedules.PipelineScheduleSingle)
    v = 2 if any(k.lower() in cls_name.lower() for k in PYTORCH_V_SHAPED) else (chunks if multi else 1)
    stages = devices * v
    if multi:
        if v == 2 and any(k.lower() in cls_name.lower() for k in PYTORCH_V_SHAPED):
            local = [0, stages - 1]
        else:
            local = [c * devices for c in range(v)]
        built = cls([_StandInStage(s, stages, 0, devices) for s in local], microbatches)
    else:
        built = cls(_StandInStage(0, stages, 0, devices), microbatches)
    order = getattr(built, "pipeline_order", None)
    if not order:
        raise PyTorchFormatError(f"torch {version}'s {cls_name} does not expose its pipeline_order; use torch >= 2.6 "
                                 f"or export its CSV with PyTorch and pass --schedule-file")
    torch_version = dialect_of(version)
    rows = [[("" if a is None else str(a)) for a in order[rank]] for rank in range(devices)]
    return schedule_from_rows(rows, torch_version=torch_version, name=f"pytorch-{cls_name}",
                              microbatches=microbatches)


def lowered_rows(program, *, torch_version: str = "2.6") -> list[list[str]]:
    """A schedule lowered to a runtime's communication (:class:`sim.core.comm_lowering.CommProgram`) as PyTorch's
    rows: its computations as :func:`pytorch_rows` writes them (U dropped, pairs as ``OVERLAP_F_B`` cells) and
    every posted send and receive as ``0SEND_F3`` / ``1RECV_F3`` cells where the runtime posts it, the form
    ``_add_send_recv`` produces; waits are implicit in PyTorch's runtime and not written."""
    _check_dialect(torch_version)
    schedule = program.schedule
    split = schedule.split_backward
    pairs = dict(schedule.overlapped)
    keys = schedule.compiled.flat.keys
    rows = []
    for device in range(schedule.devices):
        row: list[str] = []
        pending: Action | None = None  # a pair's forward, written once its backward comes
        for op, arg in program.steps(device):
            if op == STEP_COMPUTE:
                a = schedule.action_of(int(keys[arg]))
                if a.kind is ActionKind.U:
                    continue
                letter = "I" if a.kind is ActionKind.B and (a.stage, a.mb) in split and torch_version == "2.6" \
                    else a.kind.value
                cell = f"{a.stage}{letter}{a.mb}"
                if a in pairs:
                    pending = (a, cell)
                    continue
                if pending is not None:
                    row.append(f"({pending[1]};{cell})OVERLAP_F_B")
                    pending = None
                    continue
                row.append(cell)
            elif op == STEP_POST:
                row.extend(program.item_text(item) for item in program.batch(arg))
        rows.append(row)
    return rows


def write_lowered_csv(program, path: str | Path, *, torch_version: str = "2.6") -> Path:
    """Write :func:`lowered_rows` as PyTorch's CSV, one row per rank."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(lowered_rows(program, torch_version=torch_version))
    return write_text(path, buffer.getvalue())
