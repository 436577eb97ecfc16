"""``pipesim ingest``: compare a real PyTorch pipeline run (its torch.profiler traces) with pipesim's prediction.

    pipesim ingest rank0.json rank1.json -s 1f1b -K 2 -M 8 -o reports/ingest
    pipesim ingest traces/*.json.gz --from-pytorch Interleaved1F1B -K 4 -M 8 --chunks 2 -o out --json
    pipesim ingest run/*.json --schedule-file my_schedule.csv -o out --ranks 0,1,2,3
    pipesim ingest r0.json r1.json -s gpipe -K 2 -M 4 --action-pattern '(?P<kind>fwd|bwd)_(?P<mb>\\d+)' -o out
    pipesim ingest rank*.json.gz --from-pytorch 1F1B -M 8 -o out        # Schedule1F1B, profiler defaults: inferred
    pipesim ingest megatron/*.json.gz --from-megatron interleaved --chunks 2 -M 8 -o out
    pipesim ingest rank*.json --from-pytorch 1F1B -M 8 -o out --what-if 'stage 2 x0.9' --what-if 'link 0-1 x2' \
        --what-if median
    pipesim ingest train.json --overlap-pairs --action-pattern '(?P<part>\\w+)\\((?P<kind>[FBW])\\)'
    pipesim ingest rank*.json.gz --from-pytorch 1F1B -M 8 -o out --runtime torch   # PyTorch's runtime modelled

One trace per rank (``.json`` or ``.json.gz``, as ``export_chrome_trace`` or
``tensorboard_trace_handler`` write them). The schedule is given as for ``pipesim simulate``.
Writes under ``-o``: ``<stem>.md``, ``.png`` (predicted and measured Gantt on one time axis),
``_trace.json`` (both, one Chrome trace), ``.json`` (the figures), and the trace's calibration
as ``_costs.csv`` / ``_hardware.json``; with ``--what-if``, ``_whatif_trace.json`` (the measured step, its
replay, the ideal and every answer in one Perfetto trace) and a what-if section. Needs no torch (except
``--from-pytorch`` for multi-stage classes).

``--runtime torch|megatron|deepspeed|pipesim`` predicts as that runtime executes the schedule (its posting points
and link semantics, ``sim/model/runtimes.py``) with its own costs measured from the trace: the dispatch overhead (the
trace's gaps), the link time from each message's later post, the time a call that only posts holds its device
(:func:`validate.ingest.calibration.calibrate_runtime`). The report says which runtime, and shows the prediction with
and without the runtime model. Where the trace's messages are replayed (rendezvous runtimes), every profiled step is
also replayed from its own measured computations, dispatch and messages (``step_replays`` in the JSON, a note in
the report: :mod:`validate.ingest.step_replay`), the model's error step by step.
Without ``--runtime``: pipesim's eager model, no dispatch (as before issue 27).
On a trace whose action names say another runtime recorded it (PyTorch's ``PP:`` / ``Forward i`` ranges, Megatron's
functions), ``--runtime`` still predicts (a what-if), with one warning line on stderr and a note in the report.
"""

from __future__ import annotations

import argparse
import sys

from sim.schedules import registry as generators
from sim.errors import PipesimError
from sim.cli.options import add_shape_options, add_source_options, schedule_from_args, costs_from_args, hardware_from_args, positive_float, print_json
from sim.model.runtimes import RUNTIMES, get_runtime

__all__ = ["register", "run", "recorded_runtime", "runtime_mismatch"]


class IngestUsageError(PipesimError):
    """Options of ``pipesim ingest`` that do not fit together."""


def _ranks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ranks, e.g. 0,1,2,3") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are integers >= 0, e.g. 0,1,2,3")
    return values


_MEGATRON = {"1f1b": "1f1b", "interleaved": "interleaved-1f1b"}


def _runtime(text: str) -> str:
    try:
        return get_runtime(text).name
    except PipesimError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    p = sub.add_parser("ingest", help="compare torch.profiler traces of a real pipeline run with the prediction",
                       description="Read one torch.profiler (Chrome / Kineto) trace per rank of a "
                                   "torch.distributed.pipelining run, turn its actions into a measured timeline, "
                                   "calibrate costs and links from it, simulate the same schedule and write "
                                   "predicted vs measured, with the measured idle time split into dependency, "
                                   "communication and runtime gaps.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="one trace per rank (.json or .json.gz)")
    p.add_argument("--schedule", "-s", default=None,
                   help=f"the schedule the run used: {', '.join(generators.names())} (or --schedule-file / "
                        f"--from-pytorch)")
    add_shape_options(p)
    add_source_options(p)
    p.add_argument("--ranks", type=_ranks, default=None,
                   help="rank of each trace, in order (default: the trace's distributedInfo, else rank<N> in its name)")
    p.add_argument("--shapes-from", nargs="+", default=None, metavar="TRACE",
                   help="one trace per rank of one step profiled with record_shapes=True: the messages' sizes and "
                        "peers for every step of the traces, which may then be profiled without shapes (they keep "
                        "every op's inputs alive and slow the steps); ranks told as for the traces")
    p.add_argument("--action-pattern", action="append", default=[], metavar="REGEX",
                   help="regular expression for another runtime's action names, with named groups kind "
                        "(F/B/I/W/U or forward/backward/input/weight/update), mb and optionally stage; repeatable")
    p.add_argument("--from-megatron", choices=sorted(_MEGATRON), default=None,
                   help="Megatron-LM traces (torch.profiler with_stack=True): forward_step / backward_step numbered by "
                        "its 1F1B or interleaved order (--chunks, default 2)")
    p.add_argument("--what-if", action="append", default=[], metavar="QUESTION",
                   help="predict the step with a change: 'stage 2 x0.9', 'stage 1 B x0.8', 'device 3 x1.1', "
                        "'kind W x0.5' (durations times F), 'link 0-1 x2' (transfers F times as fast), 'median' "
                        "(every action at its median); join terms with ','; repeatable")
    p.add_argument("--overlap-pairs", action="store_true",
                   help="no schedule: report each overlapped forward/backward pair found with --action-pattern "
                        "(its GPU time against the sum of its parts: what --overlap-fb should be)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr while reading (default: when stderr is a terminal)")
    p.add_argument("--step", type=int, default=None, help="profiled step to compare (default: the last complete one)")
    p.add_argument("--clock", choices=("auto", "shared", "pairs"), default="auto",
                   help="auto (one clock when every trace names the same host, else align by send/receive pairs), "
                        "shared or pairs")
    p.add_argument("--costs", metavar="FILE", help="predict with this costs CSV instead of the trace's calibration")
    p.add_argument("--hardware", metavar="FILE", help="predict with this hardware JSON instead of the trace's link fit")
    p.add_argument("--microbatch-size", type=positive_float, default=1.0, help="samples per micro-batch (throughput)")
    p.add_argument("--runtime", type=_runtime, default=None, metavar="NAME",
                   help=f"predict as this runtime executes the schedule: {', '.join(RUNTIMES)}, with its dispatch "
                        f"overhead, link and post times measured from the trace; the report shows the prediction "
                        f"with and without it (default: none, pipesim's eager model without dispatch)")
    p.add_argument("--output", "-o", default=None, metavar="DIR", help="report folder (required unless --overlap-pairs)")
    p.add_argument("--timeline", metavar="FILE", help="also write the measured timeline (.csv or .parquet)")
    p.add_argument("--html", metavar="FILE", help="also copy the report's interactive page here (it is always written "
                                                  "beside the report's PNG as <stem>.html)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # K defaults to the number of traces; the hardware file is used as given
    p.set_defaults(func=run, devices=None, microbatches=None, memory_capacity=None, no_overlap=False)


def _schedule(args: argparse.Namespace):
    """The schedule the flags name; PyTorch's single-stage classes as their runtime executes them."""
    if args.devices is None:
        args.devices = len(args.traces)
    if args.microbatches is None and not args.schedule_file:
        raise IngestUsageError("give the run's micro-batches per step with -M (--microbatches)")
    if args.from_megatron:
        if args.schedule or args.schedule_file or args.from_pytorch:
            raise IngestUsageError("--from-megatron names the schedule itself; leave out -s, --schedule-file and "
                                   "--from-pytorch")
        args.schedule = _MEGATRON[args.from_megatron]
        if args.from_megatron == "1f1b" and args.chunks not in (None, 1):
            raise IngestUsageError("--from-megatron 1f1b has one chunk per rank; --chunks is for 'interleaved'")
        return schedule_from_args(args), []
    if args.from_pytorch and not args.schedule_file:
        if args.iterations != 1:
            raise IngestUsageError("--iterations applies to generated schedules; a profiled step is one iteration")
        from validate.pytorch.schedules import SINGLE_STAGE, pytorch_schedule, torch_class_for
        try:
            cls = torch_class_for(args.from_pytorch)
        except PipesimError:
            cls = None
        if cls in SINGLE_STAGE:
            return pytorch_schedule(cls, args.devices, args.microbatches, chunks=args.chunks)
    if not (args.schedule or args.schedule_file or args.from_pytorch):
        raise IngestUsageError("give the schedule the run used: --schedule NAME with -K/-M, --schedule-file FILE or "
                               "--from-pytorch CLASS")
    return schedule_from_args(args), []


# Which runtime wrote a trace, where its action names say so (validate/ingest/actions.py, module docstring): the
# ``PP:<action>`` ranges (form "PP", and DualPipeV's OVERLAP_F_B pairs, "overlap") are written by PyTorch's
# _PipelineScheduleRuntime, ``Forward i`` / ``Backward i`` (form "single") by its single-stage schedules, and Megatron's
# forward_step / backward_step (form "megatron") are read only with --from-megatron. A user's --action-pattern and
# actions numbered from the op structure alone ("pattern", "inferred") name no runtime.
_FORM_RUNTIME = {"PP": "torch", "overlap": "torch", "single": "torch", "megatron": "megatron"}
_RUNTIME_NAMES = {"torch": "PyTorch's runtime", "megatron": "Megatron-LM's runtime", "deepspeed": "DeepSpeed's runtime",
                  "pipesim": "pipesim's executor"}


def recorded_runtime(forms) -> str | None:
    """The runtime (a name of sim/model/runtimes.py) whose action names the trace holds (*forms*:
    :attr:`validate.ingest.flow.Ingested.forms`); None where the names say nothing, or contradict each other."""
    named = {_FORM_RUNTIME[f] for f in forms if f in _FORM_RUNTIME}
    return named.pop() if len(named) == 1 else None


def runtime_mismatch(forms, runtime: str | None) -> str | None:
    """The warning for ``--runtime RUNTIME`` on a trace recorded under another runtime (None: none to give). Not a
    refusal: predicting a trace as another runtime would run it is a legitimate what-if, but it must not pass for a
    validation of that runtime."""
    recorded = recorded_runtime(forms)
    if runtime is None or recorded is None or recorded == get_runtime(runtime).family:
        return None  # megatron-overlap(-flush): Megatron-LM's training modes of the same runtime
    return (f"the trace was recorded under {_RUNTIME_NAMES[recorded]}; predicting it as {runtime}'s compares two "
            f"different runtimes (a what-if, not a validation of {runtime}; --runtime {recorded} models the one "
            f"that ran)")


def _message_note(ing, args, costs, hardware, given: dict, replayed) -> str:
    """What the replay of the step's own messages rests on, and the same model with each message's median over every
    profiled step instead (closer to a prediction for another step: the gloo stalls vary from step to step)."""
    from validate.ingest.calibration import calibrate_runtime

    steps = sorted(ing.steps)
    line = (f"communication replayed from step {ing.step}'s measured messages (each gloo call's own time, link and "
            f"sender completion: validate/ingest/messages.py)")
    if len(steps) < 2:
        return line
    medians = calibrate_runtime(ing.runs(), costs, hardware, args.runtime, **given, messages=ing.message_model(steps),
                                dispatch_runs=ing.dispatch_runs())
    median_run, _ = medians.predict(ing.schedule, microbatch_size=args.microbatch_size)
    measured = ing.measured.metrics.makespan

    def error(predicted) -> str:  # as the report prints it: (measured - predicted) / predicted
        return f"{(measured / predicted.metrics.makespan - 1) * 100:+.1f}%"

    return (line + f"; with per-message medians over steps {steps[0]}..{steps[-1]} the prediction is "
            f"{median_run.metrics.makespan * 1e3:.3f} ms, error {error(median_run)} (the replay: {error(replayed)})")


def run(args: argparse.Namespace) -> int:
    from sim.files import check_writable, check_writable_dir
    from sim.simulate import simulate
    from validate.ingest.calibration import calibrate_runtime
    from validate.ingest.flow import ingest
    from validate.ingest.report import compare_ingested, format_summary, report_stem, write_ingest_report

    if args.overlap_pairs:
        if args.shapes_from:
            raise IngestUsageError("--shapes-from gives a schedule's messages their sizes; --overlap-pairs reads no "
                                   "messages")
        return _overlap_pairs(args)
    if args.output is None:
        raise IngestUsageError("give the report folder with -o (--output)")
    check_writable_dir(args.output)  # creates nothing: a refused ingest leaves no empty folder behind
    if args.timeline:
        check_writable(args.timeline)
    if args.html:
        from sim.io.pages import check_page_path
        check_page_path(args.html)
    schedule, notes = _schedule(args)
    if args.runtime is not None:  # a runtime that cannot run this schedule: one line, before the traces are read
        from sim.core.comm_lowering import lower
        from validate.ingest.flow import without_updates

        target = without_updates(schedule)
        lower(target, get_runtime(args.runtime).lowering(target))
    questions = _questions(args.what_if)
    # given costs / links are checked before the traces are read
    given_costs = costs_from_args(args, schedule.stages) if args.costs else None
    given_hw = hardware_from_args(args, schedule.devices) if args.hardware else None
    ing = ingest(args.traces, schedule, ranks=args.ranks, action_patterns=args.action_pattern, step=args.step,
                 clock=args.clock, microbatch_size=args.microbatch_size,
                 source="megatron" if args.from_megatron else "auto", progress=args.progress,
                 shapes_from=args.shapes_from)
    mismatch = runtime_mismatch(ing.forms, args.runtime)
    if mismatch is not None:  # one line now, whatever the output format; the report keeps it as a note
        print(f"pipesim ingest: warning: {mismatch}", file=sys.stderr, flush=True)
        notes.append(mismatch)
    analysis = None
    if questions is not None:
        from validate.ingest.whatif import analyse

        analysis = analyse(ing, questions)
    costs = ing.calibration.costs if given_costs is None else given_costs
    hardware = ing.calibration.hardware if given_hw is None else given_hw
    if given_costs is not None:
        notes.append(f"predicted with the costs of {args.costs}, not the trace's calibration")
    if given_hw is not None:
        notes.append(f"predicted with the links of {args.hardware}, not the trace's fit")
    predicted = simulate(ing.schedule, costs, hardware, microbatch_size=args.microbatch_size)
    runtime, without, waits, step_replays = None, None, None, None
    if args.runtime is not None:  # the runtime model on top of the same calibration; the plain prediction kept
        messages = ing.message_model()  # the compared step's measured messages (None when the trace has none)
        given = {"costs_given": given_costs is not None, "hardware_given": given_hw is not None}
        runtime = calibrate_runtime(ing.runs(), costs, hardware, args.runtime, **given, messages=messages,
                                    dispatch_runs=ing.dispatch_runs())
        without = predicted
        predicted, ran = runtime.predict(ing.schedule, microbatch_size=args.microbatch_size)
        if runtime.messages is not None and runtime.messages.send_call:
            notes.append(_message_note(ing, args, costs, hardware, given, predicted))
            # every profiled step replayed from its own measurements (the model's error step by step)
            from validate.ingest.step_replay import replay_steps

            replays = replay_steps(ing, runtime.costs, runtime.hardware, args.runtime,
                                   own_dispatch=given_costs is None, plain_costs=costs, plain_hardware=hardware,
                                   microbatch_size=args.microbatch_size)
            step_replays = replays.to_dict()
            notes.append(replays.line())
        waits = ran.communication
        runtime_model = {"lowering": ran.program.lowering}
    else:
        notes.append("predicted without a runtime model (pipesim's eager links, no dispatch overhead); --runtime "
                     "torch or megatron models that runtime with its overheads measured from the trace")
        runtime_model = None
    extra = {"notes": notes, **({"step_replays": step_replays} if step_replays is not None else {})}
    sections = []
    if analysis is not None:
        from validate.ingest.whatif import format_analysis

        extra["what_if"] = analysis.to_dict()
        sections.append(("What if: the step replayed, its ideal, and where the excess comes from",
                         "\n".join(_WHATIF_INTRO + format_analysis(analysis))))
    comparison = compare_ingested(ing, predicted, extra=extra, runtime=runtime, without=without,
                                  predicted_waits=waits)
    if runtime_model is not None:
        comparison.summary["runtime_model"].update(runtime_model)
        comparison.summary["runtime_model"]["trace_runtime"] = recorded_runtime(ing.forms)
    s = ing.schedule
    stem = report_stem(predicted, "ingest")
    paths = write_ingest_report(comparison, args.output, stem=stem,
                                title=f"Ingested run vs prediction: {s.name}, K={s.devices}, S={s.stages}, "
                                      f"M={s.microbatches}",
                                sections=sections, costs=given_costs, hardware=given_hw)
    if analysis is not None:
        from pathlib import Path

        from sim.io.trace import chrome_trace, write_trace

        results = [ing.measured, analysis.actual, analysis.ideal] + [a.result for a in analysis.answers]
        names = ["measured", "actual (replayed)", "ideal (medians)"] + [f"what if {a.question}" for a in
                                                                         analysis.answers]
        paths["whatif_trace"] = write_trace(chrome_trace(results, names=names),
                                            Path(args.output) / f"{stem}_whatif_trace.json")
    if args.timeline:
        from sim.io.timeline_io import write_timeline
        write_timeline(ing.measured, args.timeline)  # a Result: schedule and source go into Parquet metadata
    if args.html:
        from sim.io.pages import write_page
        write_page(paths["html"].read_text(encoding="utf-8"), args.html)
    if args.json:
        out = dict(comparison.summary)
        out["paths"] = {k: str(v) for k, v in paths.items()}
        print_json(out)
    else:
        print(format_summary(comparison, paths))
        if analysis is not None:
            print(f"  ideal (every action at its median) {analysis.ideal.metrics.makespan * 1e3:.3f} ms, actual "
                  f"replay {analysis.actual.metrics.makespan * 1e3:.3f} ms")
            for a in analysis.answers:
                print(f"  what if {a.question}: {a.step_time * 1e3:.3f} ms ({a.change:+.1%})")
            for family in ("stage", "link"):
                rows = analysis.attribution.get(family) or []
                if rows and rows[0]["critical_path_s"] > 0:
                    print(f"  most excess on the critical path: {rows[0]['group']} "
                          f"({rows[0]['critical_path_s'] * 1e3:.3f} ms)")
        for note in notes:
            if note != mismatch:  # said once already, as the warning above
                print(f"  note: {note}", file=sys.stderr)
    return 0


_WHATIF_INTRO = ["Method: StragglerAnalysis's what-if replay (Lin et al., OSDI'25): the step's own order simulated "
                 "with pipesim's exact engine, every action at its measured duration (actual) or at the median of "
                 "its stage and kind (ideal); transfers at their measured time where the receiver was waiting, else "
                 "the link fit. The excess actual - ideal is attributed per group three ways: its share of the "
                 "actual critical path, what setting it to ideal saves, what it costs alone (validate/ingest/whatif.py).",
                 ""]


def _questions(texts: list[str]) -> list[str] | None:
    """The --what-if questions, each read once now so that a typo fails before the traces are read."""
    if not texts:
        return None
    from validate.ingest.whatif import parse_what_if

    for text in texts:
        parse_what_if(text)
    return list(texts)


def _overlap_pairs(args: argparse.Namespace) -> int:
    from validate.ingest.pairs import overlap_pairs

    if not args.action_pattern:
        raise IngestUsageError("--overlap-pairs reads the parts of each pair with --action-pattern (named groups "
                               "kind, and optionally part and mb)")
    report = overlap_pairs(args.traces, args.action_pattern)
    if args.json:
        print_json(report.to_dict())
    else:
        print("\n".join(report.lines()))
    return 0
