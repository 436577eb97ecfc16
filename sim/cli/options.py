"""Options shared by every subcommand that simulates: schedule shape, costs and hardware."""

from __future__ import annotations

import argparse
import json
import math
import sys

from sim import schedules
from sim.core.ir import Schedule
from sim.core.passes import lower
from sim.errors import PipesimError
from sim.files import strict_json
from sim.io.schedule_io import DIALECTS, DialectError, from_pytorch_class, read_schedule_file
from sim.model.cost import CostsError, StageCosts, load_costs, uniform
from sim.model.hardware import Hardware, load_hardware

__all__ = ["add_shape_options", "add_cost_options", "costs_from_args", "hardware_from_args", "positive_int",
           "non_negative_float", "positive_float", "bandwidth_float", "int_list", "print_json",
           "join_negative_values", "DefaultInt", "given", "check_file_shape", "UsageError", "add_source_options",
           "schedule_from_args"]


class UsageError(PipesimError):
    """Bad command-line input: reported as one line, exit code 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0: an infinite cost or latency would only print inf or nan as a result."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number >= 0")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number > 0")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def bandwidth_float(text: str) -> float:
    """Bytes per second > 0; ``inf`` means an unlimited link (the default of the textbook figures)."""
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    return positive_float(text)


def join_negative_values(argv: list[str]) -> list[str]:
    """``--bandwidth -1e9`` -> ``--bandwidth=-1e9``, so that a negative number reaches its option's check.

    argparse takes ``-1e9`` (unlike ``-1``) for an option and answers "expected one argument", which hides
    the real mistake; joined, the option's type check says the number must be >= 0.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and nxt.startswith("-") and _is_number(nxt) and token.startswith("-") \
                and token != "--" and "=" not in token and not _is_number(token):
            out.append(f"{token}={nxt}" if token.startswith("--") else token + nxt)  # -K-1e9 for a short option
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class DefaultInt(int):
    """An int default that knows it is one: lets a command tell ``-K 4`` given from the default 4."""


def given(args: argparse.Namespace, name: str) -> bool:
    """Whether the user gave option *name* (shape options only: their defaults are :class:`DefaultInt` or None)."""
    value = getattr(args, name, None)
    return value is not None and not isinstance(value, DefaultInt)


def check_file_shape(args: argparse.Namespace, schedule, source: str) -> None:
    """Refuse -K, -M or --chunks that contradict the schedule read from a file: the file fixes its own shape,
    and silently simulating another shape than the one asked for would print the wrong numbers."""
    chunks = schedule.stages // schedule.devices if schedule.stages % schedule.devices == 0 else None
    for name, flag, value in (("devices", "-K/--devices", schedule.devices),
                              ("microbatches", "-M/--microbatches", schedule.microbatches),
                              ("chunks", "--chunks", chunks)):
        if given(args, name) and getattr(args, name) != value:
            have = f"{value}" if value is not None else f"{schedule.stages} stages on {schedule.devices} devices"
            raise UsageError(f"{flag} {getattr(args, name)} conflicts with {source}, which has {name} = {have}; "
                             f"drop {flag.split('/')[0]} (a schedule file fixes its own shape)")


def int_list(text: str) -> list[int]:
    """'2,4,8' or '1..128' (powers of two between) or '1-8' (every integer) or a mix: '1,3,8..32'."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ".." in part:
                lo, hi = (int(x) for x in part.split(".."))
                if lo < 1 or hi < lo:
                    raise ValueError
                v = lo
                while v <= hi:
                    values.append(v)
                    v *= 2
            elif "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-"))
                if lo < 1 or hi < lo:
                    raise ValueError
                values.extend(range(lo, hi + 1))
            else:
                values.append(positive_int(part))
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a positive integer, a doubling range 'A..B' or a range 'A-B'") from None
    return sorted(set(values))


def add_shape_options(p: argparse.ArgumentParser, *, lists: bool = False, devices: int | None = 4) -> None:
    """--devices, --microbatches (unless *lists*: a sweep takes lists), --iterations, --recompute, --chunks.

    *devices*: the default K, or None to leave --devices out (torchrun's world size decides it).
    """
    if not lists:
        if devices is not None:
            p.add_argument("--devices", "-K", type=positive_int, default=DefaultInt(devices),
                           help=f"pipeline devices K (default {devices})")
        p.add_argument("--microbatches", "-M", type=positive_int, default=DefaultInt(4), help="micro-batches M per iteration (default 4)")
    p.add_argument("--iterations", type=positive_int, default=1, help="iterations N back to back (default 1)")
    p.add_argument("--recompute", action="store_true", help="re-materialize: add R before every B")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="model chunks per device (interleaved-1f1b; default: the schedule's own, 2 for interleaved and V-shaped)")


def add_cost_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("costs and hardware (uniform stages unless --costs is given)")
    g.add_argument("--forward", type=non_negative_float, default=1.0, help="forward time per micro-batch and stage (default 1)")
    g.add_argument("--backward", type=non_negative_float, default=2.0, help="input-gradient backward time (default 2)")
    g.add_argument("--weight", type=non_negative_float, default=0.0, help="weight-gradient time (default 0; unsplit schedules run B+W as one)")
    g.add_argument("--update", type=non_negative_float, default=0.0, help="optimizer step time per stage (default 0)")
    g.add_argument("--recompute-cost", type=non_negative_float, default=None, help="R time (default: --forward)")
    g.add_argument("--activation-bytes", type=non_negative_float, default=0.0,
                   help="bytes sent between stages per micro-batch, and kept per in-flight micro-batch (default 0)")
    g.add_argument("--weight-bytes", type=non_negative_float, default=0.0, help="parameter bytes per stage (default 0)")
    g.add_argument("--costs", metavar="FILE", help="per-stage costs CSV (see README: costs file)")
    g.add_argument("--latency", type=non_negative_float, default=0.0, help="link latency in seconds (default 0)")
    g.add_argument("--bandwidth", type=bandwidth_float, default=math.inf,
                   help="link bandwidth in bytes/s (default inf: unlimited)")
    g.add_argument("--no-overlap", action="store_true", help="sends block the sending device (no comm/compute overlap)")
    g.add_argument("--hardware", metavar="FILE", help="hardware JSON (per-pair links); overrides --latency/--bandwidth")
    g.add_argument("--memory-capacity", type=positive_float, default=None, help="bytes per device; overflows are reported")
    g.add_argument("--microbatch-size", type=positive_float, default=1.0, help="samples per micro-batch, for throughput (default 1)")


def costs_from_args(args: argparse.Namespace, stages: int, chunks: int = 1) -> StageCosts:
    """Costs for *stages* stages: the --costs file as given, or uniform stages from the flags.

    With *chunks* > 1 the flags describe one device's share of the model, so each chunk costs 1/chunks.
    Costs where every computation takes 0 s are refused: the run would take no time, and utilization and
    bubble (shares of that time) would be numbers without meaning.
    """
    costs = _costs_from_args(args, stages, chunks)
    if not any(any(getattr(costs, c)) for c in ("forward", "backward", "weight", "recompute", "update")):
        source = f"costs file {args.costs!r}" if args.costs else "--forward/--backward/--weight/--update"
        raise CostsError(f"every computation takes 0 s ({source}): utilization and bubble are undefined for a run "
                         f"of no work; give the computations a time > 0")
    return costs


def _costs_from_args(args: argparse.Namespace, stages: int, chunks: int) -> StageCosts:
    if args.costs:
        costs = load_costs(args.costs)
        if costs.stages != stages:
            raise CostsError(f"costs file {args.costs!r} has {costs.stages} stages but the schedule has {stages}; "
                             f"give one row per stage")
        return costs
    devices = stages // chunks
    costs = uniform(devices, forward=args.forward, backward=args.backward, weight=args.weight, update=args.update,
                    recompute=args.recompute_cost, send_bytes=args.activation_bytes,
                    activation_bytes=args.activation_bytes, weight_bytes=args.weight_bytes,
                    grad_bytes=args.weight_bytes)
    return costs.split_into_chunks(chunks) if chunks > 1 else costs


def hardware_from_args(args: argparse.Namespace, devices: int) -> Hardware:
    if args.hardware:
        hw = load_hardware(args.hardware, devices=devices)  # refuses another K before building its link tables
        if args.memory_capacity is not None or args.no_overlap:
            hw = Hardware(devices=hw.devices, latency=hw.latency, bandwidth=hw.bandwidth,
                          memory_capacity=args.memory_capacity or hw.memory_capacity,
                          overlap=hw.overlap and not args.no_overlap)
        return hw
    return Hardware(devices=devices, latency=args.latency, bandwidth=args.bandwidth,
                    memory_capacity=args.memory_capacity, overlap=not args.no_overlap)


def print_json(obj) -> None:
    """Print strict JSON: numpy values become plain numbers, non-finite floats become null."""
    json.dump(strict_json(obj), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


# ------------------------------------------------------------------ where the schedule comes from
def add_source_options(p: argparse.ArgumentParser) -> None:
    """--schedule-file, --from-pytorch and --torch-version (``--schedule`` is added by each command)."""
    p.add_argument("--schedule-file", metavar="FILE",
                   help="read the schedule from PyTorch's CSV (.csv, one row per rank) or pipesim's JSON (.json) or "
                        "text (.txt, as `pipesim export -f text` writes it); overrides --schedule")
    p.add_argument("--from-pytorch", metavar="CLASS",
                   help="use PyTorch's own schedule class (e.g. GPipe, Interleaved1F1B, ZBVZeroBubble, DualPipeV) "
                        "with --devices, --microbatches and --chunks; needs torch")
    p.add_argument("--torch-version", choices=DIALECTS, default="2.6",
                   help="CSV dialect: 2.6 (I = input gradient, B = full backward; default) or 2.5 (B, no I)")


def schedule_from_args(args: argparse.Namespace, name: str | None = None) -> Schedule:
    """The schedule the flags name: a file, a PyTorch class, or a registered generator."""
    if getattr(args, "schedule_file", None) and getattr(args, "from_pytorch", None):
        raise PipesimError("give either --schedule-file or --from-pytorch, not both")
    imported = getattr(args, "schedule_file", None) or getattr(args, "from_pytorch", None)
    if imported and args.iterations != 1:
        raise PipesimError("--iterations applies to generated schedules; an imported schedule runs as it is written")
    if getattr(args, "schedule_file", None):
        try:
            schedule = read_schedule_file(args.schedule_file, torch_version=args.torch_version)
        except DialectError as exc:
            raise exc.for_cli() from None  # the advice names --torch-version, not the Python argument
        check_file_shape(args, schedule, f"--schedule-file {args.schedule_file}")  # -K/-M/--chunks may not contradict it
        return lower(schedule, recompute=args.recompute)
    if getattr(args, "from_pytorch", None):
        chunks = args.chunks if args.chunks and args.chunks > 1 else 2
        return lower(from_pytorch_class(args.from_pytorch, args.devices, args.microbatches, chunks=chunks),
                     recompute=args.recompute)
    return schedules.generate(name or args.schedule, args.devices, args.microbatches, iterations=args.iterations,
                              recompute=args.recompute, chunks=args.chunks)


# ------------------------------------------------------------------ runtime models (simulate, sweep, plan)
def _runtime_name(text: str) -> str:
    from sim.model.runtimes import get_runtime  # the profiles: sim/model/runtimes.py

    try:
        return get_runtime(text).name
    except PipesimError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_runtime_options(p: argparse.ArgumentParser) -> None:
    """``--runtime NAME`` (which runtime executes the schedule: where it posts sends and receives, eager or
    rendezvous links) and ``--dispatch SECONDS`` (its own time per action)."""
    from sim.model.runtimes import DEFAULT_RUNTIME, RUNTIMES

    p.add_argument("--runtime", type=_runtime_name, default=DEFAULT_RUNTIME, metavar="NAME",
                   help=f"runtime model: {', '.join(RUNTIMES)} (default {DEFAULT_RUNTIME}; README, 'Runtime models')")
    p.add_argument("--dispatch", type=non_negative_float, default=None, metavar="SECONDS",
                   help="the runtime's own time before every action (dispatch, bookkeeping), seconds; replaces the "
                        "costs' dispatch columns (default: those, 0 without them)")
    p.add_argument("--post-overhead", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="how long the runtime's call that posts a batch of sends and receives holds its device, "
                        "seconds (default 0)")


def runtime_costs(args: argparse.Namespace, costs: StageCosts) -> StageCosts:
    """*costs* with ``--dispatch`` applied (as they are without it)."""
    seconds = getattr(args, "dispatch", None)
    return costs if seconds is None else costs.with_dispatch(seconds)
