"""Cost and hardware models: file round trips, defaults, and refusals with clear messages."""

from __future__ import annotations

import inspect
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import schedules, simulate
from sim.model.cost import COLUMNS, CostsError, StageCosts, load_costs, save_costs, uniform
from sim.errors import PipesimError
from sim.model.hardware import Hardware, HardwareError, load_hardware, save_hardware
from sim.core.ir import ActionKind

values = st.one_of(st.just(0.0), st.floats(0, 1e12, allow_nan=False, allow_infinity=False))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(*[st.lists(values, min_size=n, max_size=n)] * len(COLUMNS))))
def test_costs_csv_round_trip(tmp_path_factory, columns):
    costs = StageCosts(**dict(zip(COLUMNS, columns)))
    path = tmp_path_factory.mktemp("costs") / "costs.csv"
    save_costs(costs, path, comments=["measured on a test machine", "second line"])
    text = path.read_text()
    assert text.startswith("# measured on a test machine\n# second line\nstage,forward,backward,")
    assert load_costs(path) == costs  # exact: floats are written with repr


def test_costs_defaults_and_lookup():
    c = StageCosts(forward=[1, 2], backward=[3, 4], weight=[0.5, 0.25], send_bytes=[10, 20])
    assert c.recompute == c.forward
    assert c.checkpoint_bytes == (10.0, 10.0)  # what each stage receives (stage 0: its own input size)
    assert c.cost(1, ActionKind.B) == 4 and c.cost(1, ActionKind.B, split=False) == 4.25
    assert c.cost(0, ActionKind.W) == 0.5 and c.cost(0, ActionKind.R) == 1 and c.cost(0, ActionKind.U) == 0
    assert c.scaled(2).forward == (2.0, 4.0) and c.scaled(2).send_bytes == c.send_bytes
    half = uniform(2, forward=2, activation_bytes=8).split_into_chunks(2)
    assert half.stages == 4 and half.forward == (1.0,) * 4 and half.activation_bytes == (4.0,) * 4


def test_costs_file_with_only_required_columns(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("# comment\nstage,forward\n0,0.5\n1,0.25\n")
    c = load_costs(path)
    assert c.forward == (0.5, 0.25) and c.backward == (0.0, 0.0) and c.recompute == (0.5, 0.25)


@pytest.mark.parametrize("text,message", [
    ("", "is empty"),
    ("0,1,2\n1,1,2\n", "needs 'stage' and 'forward'"),
    ("stage,backward\n0,1\n", "needs 'stage' and 'forward'"),
    ("stage,forward,speed\n0,1,2\n", "needs 'stage' and 'forward'"),
    ("stage,forward\n0,abc\n", "'abc' is not a number"),
    ("stage,forward\n0,-1\n", "negative"),
    ("stage,forward\n0,inf\n", "not a finite number"),
    ("stage,forward\n0,1,2\n", "row 2 has 3 cells but the header has 2"),
    ("stage,forward,forward\n0,1,2\n", r"the column\(s\) \['forward'\] more than once"),
    ("stage,forward\n", "no rows"),
    ("stage,forward\n1,1\n0,1\n", "stage column must read 0, 1, 2"),
])
def test_malformed_costs_files_raise(tmp_path, text, message):
    path = tmp_path / "c.csv"
    path.write_text(text)
    with pytest.raises(CostsError, match=message) as info:
        load_costs(path)
    assert str(path) in str(info.value)  # names the file
    assert isinstance(info.value, ValueError)


def test_missing_costs_file(tmp_path):
    with pytest.raises(CostsError, match="cannot read costs file"):
        load_costs(tmp_path / "absent.csv")


def test_costs_of_the_wrong_length_for_a_schedule():
    with pytest.raises(ValueError, match="costs describe 3 stages"):
        simulate(schedules.gpipe(4, 4), uniform(3))


@pytest.mark.parametrize("kw,message", [
    (dict(forward=[1, 2], backward=[1]), "backward has 1 entries but there are 2 stages"),
    (dict(forward=[1, -1], backward=[1, 1]), r"forward\[1\] = -1 is negative"),
    (dict(forward=[1, "x"], backward=[1, 1]), r"forward\[1\] must be a number, got str 'x'"),
    (dict(forward=[1, math.nan], backward=[1, 1]), "not a finite number"),
    (dict(forward=[], backward=[]), "at least one stage"),
    (dict(forward=1.0, backward=1.0), "one value per stage"),
])
def test_bad_stage_costs(kw, message):
    with pytest.raises(PipesimError, match=message):  # CostsError, or PipesimTypeError for a wrong type
        StageCosts(**kw)
    with pytest.raises(CostsError, match="positive integer"):
        uniform(0)


def test_hardware_json_round_trip(tmp_path):
    uniform_links = Hardware(devices=3, latency=1e-5, bandwidth=1e10, memory_capacity=8e9, overlap=False)
    per_pair = Hardware(devices=2, latency=[[0, 1e-3], [2e-3, 0]], bandwidth=[[math.inf, 1e9], [5e8, math.inf]])
    for hw in (uniform_links, per_pair, Hardware(devices=1)):
        path = save_hardware(hw, tmp_path / "hw.json")
        json.loads(path.read_text())  # plain JSON
        assert load_hardware(path) == hw
    assert json.loads(save_hardware(Hardware(devices=2), tmp_path / "free.json").read_text())["bandwidth"] == "inf"


def test_hardware_transfer_time():
    hw = Hardware(devices=2, latency=[[0, 0.5], [0.25, 0]], bandwidth=1e3)
    assert hw.transfer_time(0, 1, 2e3) == 2.5
    assert hw.transfer_time(1, 0, 0) == 0.25
    assert Hardware(devices=3).free_links and not hw.free_links


@pytest.mark.parametrize("kw,message", [
    (dict(devices=0), "devices must be between 1 and"),
    (dict(devices=2, latency=[[0, 1]]), r"2x2 matrix"),
    (dict(devices=2, latency=[[0, 1], [1]]), r"2x2 matrix"),
    (dict(devices=2, latency=-1), r"latency = -1.0; it must be >= 0 and finite"),
    (dict(devices=2, latency=[[0, math.inf], [0, 0]]), "finite"),
    (dict(devices=2, bandwidth=0), r"bandwidth = 0.0; it must be > 0"),
    (dict(devices=2, bandwidth=[[1, 1], [math.nan, 1]]), r"bandwidth\[1\]\[0\]"),
    (dict(devices=2, memory_capacity=0), "memory_capacity must be a positive"),
    (dict(devices=2, memory_capacity=math.inf), "memory_capacity must be a positive, finite"),
    (dict(devices=2**21), "devices must be between 1 and 1048576"),
])
def test_bad_hardware_raises(kw, message):
    with pytest.raises(HardwareError, match=message):
        Hardware(**kw)


@pytest.mark.parametrize("text,message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"latency": 1}', "must be a JSON object with at least 'devices'"),
    ('{"devices": 2, "speed": 1}', r"unknown keys \['speed'\]"),
    ('{"devices": 2, "latency": [[0, 1], [1, 0], [0, 0]]}', "2x2 matrix"),
])
def test_bad_hardware_files(tmp_path, text, message):
    path = tmp_path / "hw.json"
    path.write_text(text)
    with pytest.raises(HardwareError, match=message):
        load_hardware(path)
    with pytest.raises(HardwareError, match="cannot read hardware file"):
        load_hardware(tmp_path / "absent.json")


_VALID = st.one_of(st.floats(min_value=0.0, max_value=1e300), st.none())
_ODD = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.0, 5e-324, 1.7e308]),
                 st.integers(-3, 10**20), st.booleans(), st.just("1.0"))


@settings(max_examples=300, deadline=None)
@given(stages=st.integers(1, 5), values=st.fixed_dictionaries({c: _VALID for c in COLUMNS}),
       odd=st.one_of(st.none(), st.tuples(st.sampled_from(COLUMNS), _ODD)))
def test_uniform_is_stage_costs_of_equal_columns(stages, values, odd):
    """uniform() takes plain valid floats without the per-stage checks; whatever it is given (one odd value among
    valid ones), it builds what StageCosts builds from the same columns, or refuses with the same error."""
    if odd is not None:
        values = {**values, odd[0]: odd[1]}
    given_ = {c: v for c, v in values.items() if v is not None or c in ("recompute", "checkpoint_bytes")}
    defaults = {name: p.default for name, p in inspect.signature(uniform).parameters.items() if name != "stages"}
    as_columns = {c: None if v is None else [v] * stages for c, v in {**defaults, **given_}.items()}
    try:
        expected = StageCosts(**as_columns)
    except PipesimError as e:
        with pytest.raises(type(e), match=None) as got:
            uniform(stages, **given_)
        assert str(got.value) == str(e)
        return
    got = uniform(stages, **given_)
    assert got == expected
    assert all(type(v) is float for c in COLUMNS for v in getattr(got, c))
