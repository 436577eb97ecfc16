"""Bad input as a hostile user would give it: every case exits 2 with one short line naming the problem.

Each row of :data:`CASES` is a command line (run in-process through :func:`sim.cli.main`, so the table
stays fast), the exit code it must give and a fragment its one error line must contain. Files the
command lines need are written by the ``files`` fixture; ``{d}`` in an argument is their folder.
A few cases run as subprocesses where the process itself matters (memory limits, the traceback of a bug).
The hypothesis tests at the end feed random bytes and random JSON to every file reader and accept
only a valid result or a typed :class:`sim.errors.PipesimError`.
"""

from __future__ import annotations

import pytest

import sim.cli
from sim.errors import PipesimError, one_line, quote


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``pipesim *argv*`` run in this process."""
    try:
        code = sim.cli.main(argv)
    except SystemExit as exc:  # argparse's --help / --version
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ one error base (issue 15.9)
def test_every_typed_error_is_a_pipesim_error_and_a_value_error():
    import importlib
    import inspect
    import pkgutil

    import sim

    found = []
    for info in pkgutil.walk_packages(sim.__path__, "sim."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Exception) and cls.__module__ == info.name:
                found.append(cls)
                assert issubclass(cls, PipesimError) and issubclass(cls, ValueError), cls
    assert len(found) >= 10  # the walk really saw the package


def test_an_internal_bug_is_a_traceback_with_exit_1_not_a_user_error(monkeypatch, capsys):
    import sim.cli.simulate as command

    def broken(args):
        raise KeyError("internal")  # what a bug of ours looks like: not a PipesimError

    monkeypatch.setattr(command, "simulate_from_args", broken)
    code, _, err = run_cli(["simulate"], capsys)
    assert code == 1
    assert "Traceback" in err and "bug in pipesim" in err and "KeyError" in err


def test_a_plain_value_error_from_a_bug_is_not_reported_as_bad_input(monkeypatch, capsys):
    import sim.cli.simulate as command

    monkeypatch.setattr(command, "simulate_from_args", lambda args: int("x"))  # ValueError, but ours
    code, _, err = run_cli(["simulate"], capsys)
    assert code == 1 and "bug in pipesim" in err


def test_error_lines_are_cut_and_quotes_are_short():
    assert len(one_line(PipesimError("x" * 10_000))) <= 400
    assert one_line(PipesimError("first\nsecond")) == "first"
    assert len(quote("9" * 1_000_000)) < 100
    assert quote("0F0") == "'0F0'"


# ------------------------------------------------------------------ the table of hostile command lines
FILES = {
    "hw100k.json": '{"devices": 100000}',
    "hw_overlap_str.json": '{"devices": 4, "overlap": "false"}',
    "hw_empty.json": "",
    "one_stage_huge.csv": "99999999F0\n",
    "one_mb_huge.csv": "0F99999999\n",
    "stage_million.csv": "1000000F0\n",
    "long_cell.csv": "0F" + "9" * 5000 + "\n",
    "mb_3e9.json": '{"devices": 1, "microbatches": 3e9, "placement": [0], "actions": {"0": ["0F0"]}}',
    "mb_int_huge.json": '{"devices": 1, "microbatches": 3000000000, "placement": [0], "actions": {"0": ["0F0"]}}',
    "devices_huge.json": '{"devices": 1000000000000, "microbatches": 1, "actions": {"0": ["0F0", "0B0"]}}',
    "empty.json": "",
    "s2x3.csv": "0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1F1,1F2,1B0,1B1,1B2\n",
    "dup_column.csv": "stage,forward,backward,forward\n0,1,2,3\n1,1,2,3\n2,1,2,3\n3,1,2,3\n",
    "zero_costs.csv": "stage,forward,backward\n0,0,0\n1,0,0\n2,0,0\n3,0,0\n",
    "huge_costs.csv": "stage,forward,backward\n0,1e308,1e308\n1,1,1\n2,1,1\n3,1,1\n",
    "bom_costs.csv": "\ufeffstage,forward,backward\n0,1,2\n1,1,2\n2,1,2\n3,1,2\n",
    "bom_hw.json": '\ufeff{"devices": 4, "latency": 0.5}',
    "hw_latency_huge.json": '{"devices": 4, "latency": 1e308}',
    "layers_zero.csv": "layer,forward,backward,activation_bytes,parameter_bytes\na,0,0,0,0\nb,0,0,0,0\n",
    "layers_huge.csv": "layer,forward,backward,activation_bytes,parameter_bytes\na,1e308,1e308,0,0\nb,1,1,0,0\n",
}
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


@pytest.fixture
def files(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    for name in ("binary.csv", "binary.json"):
        (tmp_path / name).write_bytes(BINARY)
    return tmp_path


CASES = [
    # 15.1: tiny inputs that would exhaust memory are refused by size, with one short line
    (["simulate", "-K", "4", "--hardware", "{d}/hw100k.json"], 2, "describes 100000 devices; the schedule needs 4"),
    (["simulate", "--schedule-file", "{d}/one_stage_huge.csv"], 2, "99999999 stage(s) have no actions"),
    (["simulate", "--schedule-file", "{d}/one_mb_huge.csv"], 2, "need at least 200000000"),
    (["simulate", "--schedule-file", "{d}/stage_million.csv"], 2, "1000000 stage(s) have no actions"),
    (["simulate", "--schedule-file", "{d}/long_cell.csv"], 2, "index above"),
    (["simulate", "--schedule-file", "{d}/mb_3e9.json"], 2, "microbatches must be a positive whole number"),
    (["simulate", "--schedule-file", "{d}/mb_int_huge.json"], 2, "need at least 6000000000 actions"),
    (["simulate", "--schedule-file", "{d}/devices_huge.json"], 2, "need at least"),
    # 15.3: -K / -M / --chunks that contradict a schedule file are refused, not silently ignored
    (["simulate", "--schedule-file", "{d}/s2x3.csv", "-K", "4"], 2, "-K/--devices 4 conflicts with"),
    (["simulate", "--schedule-file", "{d}/s2x3.csv", "-M", "8"], 2, "-M/--microbatches 8 conflicts with"),
    (["simulate", "--schedule-file", "{d}/s2x3.csv", "--chunks", "2"], 2, "--chunks 2 conflicts with"),
    (["simulate", "--schedule-file", "{d}/s2x3.csv", "-K", "2", "-M", "3", "--chunks", "1"], 0, ""),
    (["export", "--schedule-file", "{d}/s2x3.csv", "-M", "8"], 2, "-M/--microbatches 8 conflicts with"),
    (["simulate", "--hardware", "{d}/hw_overlap_str.json"], 2, "overlap must be true or false"),
    (["simulate", "--forward", "inf"], 2, "'inf' must be finite"),
    (["simulate", "--latency", "inf"], 2, "'inf' must be finite"),
    (["simulate", "--microbatch-size", "inf"], 2, "'inf' must be finite"),
    (["simulate", "--memory-capacity", "nan"], 2, "must be a number > 0"),
    (["simulate", "--costs", "{d}/dup_column.csv"], 2, "the column(s) ['forward'] more than once"),
    (["simulate", "--costs", "{d}/zero_costs.csv"], 2, "every computation takes 0 s"),
    (["simulate", "--forward", "0", "--backward", "0"], 2, "every computation takes 0 s"),
    (["simulate", "--costs", "{d}/huge_costs.csv"], 2, "costs add up past the largest number"),
    (["simulate", "--forward", "1e308", "-M", "8"], 2, "costs add up past the largest number"),
    (["simulate", "--activation-bytes", "1e308"], 2, "byte sizes add up past the largest number"),
    (["simulate", "--weight-bytes", "1e308"], 2, "byte sizes add up past the largest number"),
    (["simulate", "--activation-bytes", "1e300", "--bandwidth", "1e-300"], 2, "transfer times overflow"),
    (["simulate", "--latency", "1e308"], 2, "transfer times overflow"),
    (["simulate", "--hardware", "{d}/hw_latency_huge.json"], 2, "transfer times overflow"),
    (["simulate", "--jitter", "inf"], 2, "argument --jitter: 'inf' must be finite"),
    (["simulate", "--jitter", "1e200"], 2, "jitter must be >= 0 and at most"),
    (["collective", "--latency", "inf"], 2, "'inf' must be a finite number >= 0"),
    (["collective", "--reduce-cost", "inf"], 2, "'inf' must be a finite number >= 0"),
    (["collective", "--bytes", "1e308", "--reduce-cost", "1e10"], 2, "add up past the largest float"),
    (["collective", "--latency", "1e308", "-a", "sequential"], 2, "all-reduce time overflows"),
    (["partition", "--layers", "{d}/layers_huge.csv", "-K", "2"], 2, "add up past the largest float"),
    (["partition", "--layers", "{layers}", "-K", "4", "--bandwidth", "1e-305"], 2, "take longer than the largest"),
    (["partition", "--layers", "{d}/layers_zero.csv", "-K", "2"], 2, "takes 0 s (forward + backward)"),
    (["partition", "--layers", "{d}/layers_zero.csv", "-K", "2", "--replicate"], 2, "takes 0 s (forward + backward)"),
    (["replicate", "-s", "1f1b", "-K", "2", "-M", "2", "--forward", "1e308"], 2, "costs add up past the largest"),
    (["replicate", "-s", "1f1b", "-K", "2", "-M", "2", "--weight-bytes", "1e308", "--bandwidth", "1e10"], 2,
     "add up past the largest"),
    # 15.7: wording
    (["simulate", "--costs", "{d}/bom_costs.csv"], 0, ""),  # Excel's UTF-8 byte-order mark is fine
    (["simulate", "--hardware", "{d}/bom_hw.json"], 0, ""),
    (["simulate", "--bandwidth", "-1e9"], 2, "argument --bandwidth: '-1e9' must be a number > 0"),
    (["simulate", "-K", "-1e9"], 2, "'-1e9' is not an integer"),
    (["simulate", "--schedule-file", "{d}/binary.csv"], 2, "binary.csv' is not UTF-8 text"),
    (["simulate", "--schedule-file", "{d}/binary.json"], 2, "binary.json' is not UTF-8 text"),
    (["simulate", "--schedule-file", "{d}/empty.json"], 2, "empty.json' is empty"),
    (["simulate", "--hardware", "{d}/hw_empty.json"], 2, "hw_empty.json' is empty"),
]


@pytest.mark.parametrize("argv,code,fragment", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_hostile_command_line(files, capsys, argv, code, fragment):
    from pathlib import Path

    layers = str(Path(__file__).resolve().parents[1] / "examples" / "layers.csv")
    got, out, err = run_cli([a.replace("{d}", str(files)).replace("{layers}", layers) for a in argv], capsys)
    assert got == code, err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pipesim: error: "), err
        assert len(lines[0]) <= 420, f"{len(lines[0])} characters"
        assert fragment in lines[0]
        assert "Traceback" not in err


# ------------------------------------------------------------------ the Python API (issue 15.8)
def _simulate_args():
    from sim import schedules, uniform

    return schedules.gpipe(2, 2), uniform(2)


@pytest.mark.parametrize("bad", [None, "costs.csv", [1.0, 2.0], {"forward": [1, 1]}, 3])
def test_simulate_refuses_wrong_cost_types_naming_the_argument(bad):
    from sim import simulate

    schedule, _ = _simulate_args()
    with pytest.raises(TypeError, match=r"^costs must be a StageCosts") as info:
        simulate(schedule, bad)
    assert isinstance(info.value, PipesimError)  # typed: the CLI reports it as one line


@pytest.mark.parametrize("bad", ["hw.json", [4], {"devices": 2}, 2])
def test_simulate_refuses_wrong_hardware_types_naming_the_argument(bad):
    from sim import simulate

    schedule, costs = _simulate_args()
    with pytest.raises(TypeError, match=r"^hardware must be a Hardware"):
        simulate(schedule, costs, bad)
    with pytest.raises(TypeError, match=r"^schedule must be a Schedule"):
        simulate("gpipe", costs)


def test_any_real_number_type_is_a_cost_and_numpy_integers_are_device_counts():
    from decimal import Decimal
    from fractions import Fraction

    import numpy as np

    from sim import schedules, simulate
    from sim.model.cost import StageCosts
    from sim.model.hardware import Hardware

    plain = simulate(schedules.gpipe(2, 2), StageCosts(forward=[1.0, 1.0], backward=[2.0, 2.0]))
    for kind in (np.float32, np.float64, Decimal, Fraction, int, np.int64):
        costs = StageCosts(forward=[kind(1), kind(1)], backward=[kind(2), kind(2)])
        got = simulate(schedules.gpipe(2, 2), costs, Hardware(devices=np.int64(2), latency=kind(0)))
        assert got.metrics.makespan == plain.metrics.makespan, kind
    assert StageCosts(forward=[Fraction(1, 3)], backward=[Decimal("0.5")]).forward == (1 / 3,)
    assert Hardware(devices=np.int64(3)).devices == 3 and type(Hardware(devices=np.int64(3)).devices) is int
    assert Hardware(devices=2, overlap=np.bool_(False)).overlap is False


@pytest.mark.parametrize("kw,message", [
    (dict(overlap="no"), "overlap must be true or false"),
    (dict(overlap="false"), "overlap must be true or false"),
    (dict(overlap=0), "overlap must be true or false"),
    (dict(devices=2.0), "devices must be an integer"),
    (dict(devices=True), "devices must be an integer"),
    (dict(latency="0.1"), "latency must be a number or a 2x2 matrix"),
    (dict(memory_capacity="8e9"), "memory_capacity must be a number"),
])
def test_hardware_refuses_wrong_types(kw, message):
    from sim.model.hardware import Hardware

    with pytest.raises(TypeError, match=message):
        Hardware(**{"devices": 2, **kw})


@pytest.mark.parametrize("bad", [True, "1.0", None])
def test_costs_refuse_wrong_types(bad):
    from sim.model.cost import StageCosts

    with pytest.raises(TypeError, match=r"forward\[0\] must be a number"):
        StageCosts(forward=[bad], backward=[1.0])


def test_jitter_and_overflow_are_refused_in_the_api():
    import math

    from sim import schedules, simulate, uniform

    s = schedules.gpipe(2, 4)
    for jitter in (math.inf, math.nan, -1.0, 1e200):
        with pytest.raises(PipesimError, match="jitter must be"):
            simulate(s, uniform(2), jitter=jitter)
    with pytest.raises(PipesimError, match="costs add up past the largest"):
        simulate(s, uniform(2, forward=1e308))
    with pytest.raises(PipesimError, match="byte sizes add up"):
        simulate(s, uniform(2, activation_bytes=1e308))


def test_zero_work_keeps_bubble_equal_to_one_minus_utilization():
    from sim import schedules, simulate, uniform

    m = simulate(schedules.gpipe(2, 2), uniform(2, forward=0, backward=0)).metrics
    assert m.makespan == 0 and m.bubble_fraction == 1 - m.utilization == 0.0


# ------------------------------------------------------------------ stray files (issue 15.6)
OUTPUTS_TO_FOLDERS = [
    ["simulate", "--timeline", "{d}/out.csv"],
    ["simulate", "--timeline", "{d}/out.parquet"],
    ["simulate", "--trace", "{d}/out.json"],
    ["export", "-o", "{d}/out.csv"],
    ["export", "--format", "json", "-o", "{d}/out.json"],
    ["gantt", "-s", "1f1b", "-o", "{d}/out.png"],
    ["partition", "--layers", "{layers}", "-K", "2", "-o", "{d}/out.csv"],
    ["replicate", "-s", "1f1b", "-K", "2", "-M", "4", "--gantt", "{d}/out.png"],
    ["replicate", "-s", "1f1b", "-K", "2", "-M", "4", "--timeline", "{d}/out.csv"],
]


@pytest.mark.parametrize("argv", OUTPUTS_TO_FOLDERS, ids=[" ".join(a) for a in OUTPUTS_TO_FOLDERS])
def test_an_output_path_that_is_a_folder_gives_one_line_and_leaves_nothing(tmp_path, capsys, argv):
    from pathlib import Path

    layers = Path(__file__).resolve().parents[1] / "examples" / "layers.csv"
    for name in ("out.csv", "out.parquet", "out.json", "out.png"):
        (tmp_path / name).mkdir()
    code, _, err = run_cli([a.replace("{d}", str(tmp_path)).replace("{layers}", str(layers)) for a in argv], capsys)
    assert code == 2 and err.count("\n") == 1 and "is an existing folder" in err, err
    left = sorted(p.name for p in tmp_path.rglob("*"))
    assert left == ["out.csv", "out.json", "out.parquet", "out.png"], left  # the folders, empty: no .tmp anywhere


@pytest.mark.parametrize("argv", [["sweep", "--schedules", "1f1b", "-K", "2", "-M", "2", "--no-progress", "-o"],
                                  ["collective", "--sweep", "2..4", "-o"], ["demo", "--no-validate", "-o"]])
def test_an_output_folder_that_is_a_file_gives_one_line(tmp_path, capsys, argv):
    (tmp_path / "file").write_text("keep me")
    code, _, err = run_cli(argv + [str(tmp_path / "file")], capsys)
    assert code == 2 and "it is a file, not a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


def test_every_writer_goes_through_the_atomic_helper():
    """No output is written by hand: every write call sits in a block of sim.files' atomic_path(s) (or writes
    the temporary path it yields), or in a worker's private scratch folder (validate/rank/worker.py, launch.py,
    torch_runtime.py)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"open\([^)]*[\"']w|\.write_text\(|\.write_bytes\(|\.savefig\(|\.to_csv\(|\.to_parquet\(")
    scratch = {"validate/rank/worker.py", "validate/launch.py", "validate/pytorch/runtime.py", "sim/files.py"}
    offenders = []
    for path in sorted([*root.glob("sim/**/*.py"), *root.glob("validate/**/*.py")]):
        rel = path.relative_to(root).as_posix()
        if rel in scratch:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            inside_helper = any("atomic_path" in above for above in lines[max(0, i - 10):i])  # its with-block
            if pattern.search(line) and not inside_helper and "tmp" not in line:
                offenders.append(f"{rel}:{i + 1}: {line.strip()}")
    assert not offenders, "writes outside the atomic helper:\n" + "\n".join(offenders)


@pytest.mark.slow  # imports torch
def test_validate_refuses_a_bad_timeout_and_an_unwritable_folder_before_starting_processes(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import validate.launch
    from validate.run import run_validation

    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(validate.launch, "launch", no_launch)
    (tmp_path / "file").write_text("")
    for timeout in (-1, 0, float("inf"), float("nan")):
        with pytest.raises(PipesimError, match="timeout must be"):
            run_validation("gpipe", 2, 2, timeout=timeout, output_dir=None)
    with pytest.raises(PipesimError, match="cannot create the folder .* is a file, not a folder"):
        run_validation("gpipe", 2, 2, output_dir=tmp_path / "file" / "reports")
    with pytest.raises(PipesimError, match="it is a file, not a folder"):
        run_validation("gpipe", 2, 2, output_dir=tmp_path / "file")


# ------------------------------------------------------------------ every file reader against random input
import json as _json  # noqa: E402
import tracemalloc  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
PEAK_BYTES = 64 * 2**20
"""Most memory one read of a file of a few hundred bytes may take (tracemalloc's peak): a size read from the
file must be checked before anything that large is allocated."""


def _readers():
    from sim.model.cost import load_costs
    from sim.model.hardware import load_hardware
    from sim.model.layers import load_layers
    from sim.io.schedule_io import read_schedule_file

    return {"costs.csv": load_costs, "hardware.json": load_hardware, "layers.csv": load_layers,
            "schedule.csv": read_schedule_file, "schedule.json": read_schedule_file}


def _read_bounded(reader, path):
    """Call *reader*; it must return or raise a PipesimError, within PEAK_BYTES of memory."""
    tracemalloc.start()
    try:
        try:
            result = reader(path)
        except PipesimError:
            result = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"reading {path.name} took {peak / 2**20:.0f} MiB"
    return result


def _check_valid(name, result):
    import math

    if result is None:
        return
    if name == "costs.csv":
        assert all(math.isfinite(v) and v >= 0 for c in result.to_dict().values() for v in c)
    elif name == "hardware.json":
        assert 1 <= result.devices and isinstance(result.overlap, bool)
    elif name == "layers.csv":
        assert result.layers >= 1 and all(math.isfinite(v) and v >= 0 for v in result.compute)
    else:
        assert result.validate() is result  # a schedule that loads can run


_TOKENS = ["0", "1", "2", "3", "9", "99999999", "-1", "1e308", "inf", "nan", "F", "B", "W", "I", "BW", "U", "R",
           "SEND_F", "RECV_B", "_", "OVERLAP_F_B", "(", ")", ";", ",", ",", "\n", "\n", " ", "#", '"', "\ufeff",
           "stage", "forward", "backward", "weight", "layer", "activation_bytes", "parameter_bytes", "\x00", "é"]
csvish = st.lists(st.sampled_from(_TOKENS), max_size=60).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 10**12) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["inf", "0F0", "0B0", "1F0", "false", "3e9"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["devices", "microbatches", "iterations", "placement", "actions", "latency", "bandwidth",
                         "overlap", "memory_capacity", "0", "1", "name"]), inner, max_size=6),
    max_leaves=20)


@FUZZ
@given(name=st.sampled_from(sorted(_readers())), data=st.binary(max_size=300))
def test_random_bytes_give_a_typed_error_or_a_valid_result(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    _check_valid(name, _read_bounded(_readers()[name], path))


@FUZZ
@given(name=st.sampled_from(["costs.csv", "layers.csv", "schedule.csv"]), text=csvish)
def test_random_csv_like_text_gives_a_typed_error_or_a_valid_result(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    _check_valid(name, _read_bounded(_readers()[name], path))


@FUZZ
@given(name=st.sampled_from(["hardware.json", "schedule.json"]), value=json_values)
def test_random_json_gives_a_typed_error_or_a_valid_result(tmp_path, name, value):
    path = tmp_path / name
    path.write_text(_json.dumps(value), encoding="utf-8")
    _check_valid(name, _read_bounded(_readers()[name], path))


LARGE_SIZES = {
    "hardware.json": ['{"devices": 100000}', '{"devices": 1048576, "latency": [[0]]}', '{"devices": 10000000000}',
                      '{"devices": 3, "latency": [[0, 1, 2], [1, 0, 2]]}', '{"devices": 1' + "0" * 5000 + "}"],
    "schedule.csv": ["99999999F0", "0F99999999", "1000000F0", "(" * 3000 + "0F0" + ")OVERLAP_F_B" * 3000,
                     "0F0," * 20000, "0F" + "9" * 5000],
    "schedule.json": ['{"devices": 1, "microbatches": 3000000000, "placement": [0], "actions": {"0": ["0F0"]}}',
                      '{"devices": 1000000000000, "microbatches": 1, "actions": {"0": ["0F0", "0B0"]}}',
                      '{"devices": 1, "microbatches": 1, "iterations": 99999999999, "actions": {"0": []}}'],
}
_BOUNDED_READS = """
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: a K x K table of 10^5 would need 80 GB
from sim.errors import PipesimError
from sim.model.hardware import load_hardware
from sim.io.schedule_io import read_schedule_file
for path in sorted(Path(sys.argv[1]).iterdir()):
    reader = load_hardware if path.name.startswith("hardware") else read_schedule_file
    try:
        reader(path)
        print(path.name, "read")
    except PipesimError as exc:
        print(path.name, "refused:", str(exc).splitlines()[0][:120])
"""


@pytest.mark.slow
def test_large_sizes_in_tiny_files_are_refused_in_bounded_memory_and_time(tmp_path):
    """In a child process capped at 1 GiB of address space and 120 s: a regression fails, it cannot hang the suite."""
    import subprocess
    import sys
    from pathlib import Path

    count = 0
    for name, texts in LARGE_SIZES.items():
        stem, suffix = name.split(".")
        for i, text in enumerate(texts):
            (tmp_path / f"{stem}{i}.{suffix}").write_text(text + "\n")
            count += 1
    done = subprocess.run([sys.executable, "-c", _BOUNDED_READS, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == count, done.stdout
    for line in lines:  # 10^5 devices is a valid description, read in O(K) memory; every other one is refused
        assert ("read" if line.startswith("hardware0.json") else "refused:") in line, line


def test_the_memory_bound_can_fail():
    """The bound is real: reading that builds a K x K table of a file's K is caught."""
    with pytest.raises(AssertionError, match="MiB"):
        _read_bounded(lambda path: [[0.0] * 3000 for _ in range(3000)], type("P", (), {"name": "x"})())


def test_a_schedule_built_in_python_with_a_huge_shape_is_refused_before_its_tables_are_built():
    from sim.core.ir import F, Schedule, ScheduleError

    tracemalloc.start()
    try:
        with pytest.raises(ScheduleError, match="1999999999 action"):
            Schedule.build(name="typo", devices=1, microbatches=10**9, actions={0: [F(0, 0)]}).validate()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_negative_numbers_reach_their_option_check():
    from sim.cli.options import join_negative_values

    assert join_negative_values(["simulate", "--bandwidth", "-1e9", "-K", "-1e3", "--json"]) == \
        ["simulate", "--bandwidth=-1e9", "-K-1e3", "--json"]
    assert join_negative_values(["--latency", "-inf", "--", "-1"]) == ["--latency=-inf", "--", "-1"]
    assert join_negative_values(["--bandwidth=-1", "-s", "1f1b"]) == ["--bandwidth=-1", "-s", "1f1b"]


@pytest.mark.parametrize("argv,code,fragment", [
    (["simulate", "--bandwidth", "-1e9"], 2, "pipesim: error: argument --bandwidth: '-1e9' must be a number > 0"),
    (["export", "--schedule-file", "missing.csv"], 2, "pipesim: error: cannot read schedule file 'missing.csv'"),
])
def test_the_installed_command_exits_with_one_line(tmp_path, argv, code, fragment):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", "import sys, sim.cli; sys.exit(sim.cli.main())", *argv],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == code and done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(fragment), done.stderr


def test_checking_a_report_folder_creates_nothing(tmp_path):
    from sim.files import OutputError, check_writable_dir

    assert check_writable_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []  # a run stopped before writing leaves no empty folder
    (tmp_path / "f").write_text("")
    for bad in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(OutputError, match="is a file, not a folder"):
            check_writable_dir(bad)
