"""Collectives: simulated times against the alpha-beta closed forms, and the data each worker ends with."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines import collectives
from sim.cli import main
from sim.engines.collectives import ALGORITHMS, CollectiveError, Message, simulate_collective
from sim.errors import PipesimError

ALPHA, BW = 0.5, 1000.0  # seconds per message, bytes per second
BETA = 1 / BW


def closed_form(algorithm: str, N: int, n: float, a: float = ALPHA, b: float = BETA, g: float = 0.0) -> float:
    """Thakur, Rabenseifner and Gropp (2005), single-port alpha-beta-gamma model."""
    if N == 1 and not algorithm.startswith("ps"):
        return 0.0
    lg = math.log2(N)
    p = 1 << (N.bit_length() - 1)
    return {
        "ring": 2 * (N - 1) * a + 2 * (N - 1) / N * n * b + (N - 1) / N * n * g,
        "parallel": (N - 1) * (a + n * b) + n * g,  # the lecture's: N-1 whole vectors in, the last one reduced
        "direct": 2 * (N - 1) * a + 2 * (N - 1) / N * n * b + (N - 1) / N * n * g,
        "halving-doubling": (2 * math.log2(p) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g
                             + (0 if p == N else 2 * (a + n * b) + n * g)),
        "tree": 2 * math.ceil(lg) * (a + n * b) + math.ceil(lg) * n * g,
        "sequential": 2 * (N - 1) * (a + n * b) + n * g,  # reductions overlap the next receive (g n < a + n b)
        "ps": 2 * N * (a + n * b) + n * g,
        "ps-sharded": 2 * (N * a + n * b) + n * g,
    }[algorithm]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("N", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_time_matches_closed_form_and_data_is_reduced(algorithm, N):
    n = 4800.0
    r = simulate_collective(algorithm, workers=N, nbytes=n, latency=ALPHA, bandwidth=BW)
    assert r.complete, r.problems
    assert r.time == pytest.approx(closed_form(algorithm, N, n), rel=1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "halving-doubling", "tree", "sequential", "ps", "parallel", "direct"])
@pytest.mark.parametrize("N", [4, 6, 8])
def test_reduction_cost_gamma(algorithm, N):
    n, gamma = 2400.0, 1e-4
    r = simulate_collective(algorithm, workers=N, nbytes=n, latency=ALPHA, bandwidth=BW, reduce_cost=gamma)
    assert r.complete
    if algorithm == "tree" and N == 6:  # uneven binomial tree: reductions overlap receives, the rounds bound it
        assert closed_form(algorithm, N, n) < r.time < closed_form(algorithm, N, n, g=gamma)
    else:
        assert r.time == pytest.approx(closed_form(algorithm, N, n, g=gamma), rel=1e-9)


@pytest.mark.parametrize("N", [2, 4, 8, 5])
def test_bandwidth_accounting(N):
    n = 1000.0
    ring = simulate_collective("ring", workers=N, nbytes=n)
    assert ring.total_bytes == pytest.approx(2 * (N - 1) * n)
    assert ring.peak_node_bytes == pytest.approx(4 * (N - 1) / N * n)  # sent + received
    ps = simulate_collective("ps", workers=N, nbytes=n)
    assert ps.peak_node_bytes == pytest.approx(2 * N * n)  # the server
    assert ps.total_bytes == pytest.approx(2 * N * n)
    tree = simulate_collective("tree", workers=N, nbytes=n)
    assert tree.peak_node_bytes == pytest.approx(2 * math.ceil(math.log2(N)) * n)
    # the lecture's parallel: one step, every worker sends and receives N-1 whole vectors, O(N^2) on the network
    parallel = simulate_collective("parallel", workers=N, nbytes=n)
    assert parallel.steps == 1 and len(parallel.messages) == N * (N - 1)
    assert parallel.peak_node_bytes == pytest.approx(2 * (N - 1) * n)
    assert parallel.total_bytes == pytest.approx(N * (N - 1) * n)
    direct = simulate_collective("direct", workers=N, nbytes=n)  # reduce-scatter + all-gather: ring's bytes
    assert direct.steps == 2 * (N - 1) and direct.total_bytes == pytest.approx(2 * (N - 1) * n)
    assert direct.peak_node_bytes == pytest.approx(4 * (N - 1) / N * n)


@settings(max_examples=25, deadline=None)
@given(algorithm=st.sampled_from(ALGORITHMS), N=st.integers(1, 20),
       starts=st.lists(st.floats(0, 5), min_size=20, max_size=20))
def test_every_worker_gets_the_full_sum_with_staggered_starts(algorithm, N, starts):
    r = simulate_collective(algorithm, workers=N, nbytes=640.0, latency=0.01, bandwidth=1e4,
                            start_times=starts[:N])
    assert r.complete, r.problems
    msgs = r.messages
    # no node sends two messages at once, nor receives two at once
    for col in ("src", "dst"):
        for _, rows in msgs.groupby(col):
            rows = rows.sort_values("start")
            assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-12).all()
    for w in range(N):  # nobody sends before its vector is ready
        assert (msgs[msgs["src"] == w]["start"] >= starts[w] - 1e-12).all()
        assert r.finish[w] >= starts[w]


def test_a_wrong_algorithm_is_caught(monkeypatch):
    ring = collectives._ring

    def broken_ring(n):  # all-gather forwards the wrong chunk: some workers never see the full sum
        G, nodes, out = ring(n)
        out = [m if m.reduce else Message(step=m.step, src=m.src, dst=m.dst, chunks=((m.chunks[0] + 1) % n,),
                                          reduce=False) for m in out]
        return G, nodes, out

    def double_count(n):  # reduce-scatter sends the same chunk twice
        G, nodes, out = ring(n)
        return G, nodes, out + [Message(step=0, src=0, dst=1, chunks=(0,), reduce=True)]

    for fake in (broken_ring, double_count):
        monkeypatch.setattr(collectives, "_ring", fake)
        r = simulate_collective("ring", workers=4, nbytes=400.0)
        assert not r.complete and r.problems

    parallel = collectives._parallel

    def forwards_its_sum(n):  # sends what it holds (its sum so far), not its own vector: counts others twice
        G, nodes, out = parallel(n)
        return G, nodes, [Message(step=m.step, src=m.src, dst=m.dst, chunks=m.chunks, reduce=True) for m in out]

    def skips_one(n):  # one worker never hears from another
        G, nodes, out = parallel(n)
        return G, nodes, out[1:]

    for fake in (forwards_its_sum, skips_one):
        monkeypatch.setattr(collectives, "_parallel", fake)
        r = simulate_collective("parallel", workers=4, nbytes=400.0, latency=0.1, bandwidth=1e3)
        assert not r.complete and r.problems, fake.__name__


def test_errors():
    with pytest.raises(CollectiveError, match="choose one of"):
        simulate_collective("butterfly", workers=4, nbytes=1)
    with pytest.raises(CollectiveError, match="workers"):
        simulate_collective("ring", workers=0, nbytes=1)
    with pytest.raises(CollectiveError, match="bandwidth"):
        simulate_collective("ring", workers=2, nbytes=1, bandwidth=0)
    assert issubclass(CollectiveError, PipesimError)


@pytest.mark.parametrize("kwargs, name", [
    ({"latency": math.inf}, "latency"), ({"latency": -1.0}, "latency"), ({"latency": math.nan}, "latency"),
    ({"reduce_cost": math.inf}, "reduce_cost"), ({"reduce_cost": -1e-9}, "reduce_cost"),
    ({"nbytes": math.inf}, "bytes"), ({"nbytes": math.nan}, "bytes"), ({"bandwidth": math.nan}, "bandwidth"),
    ({"bandwidth": -5.0}, "bandwidth"), ({"latency": [[0, math.inf], [0, 0]]}, "latency"),
    ({"start_times": [0.0, math.inf]}, "start_times"), ({"start_times": [0.0, -1.0]}, "start_times"),
])
def test_non_finite_or_negative_numbers_are_refused(kwargs, name):
    args = {"workers": 2, "nbytes": 100.0, **kwargs}
    with pytest.raises(CollectiveError, match=name):
        simulate_collective("ring", **args)


def test_unlimited_bandwidth_is_allowed_and_too_many_messages_refused_at_once():
    assert simulate_collective("ring", workers=4, nbytes=100.0, latency=1.0, bandwidth=math.inf).time == 6.0
    with pytest.raises(CollectiveError, match="messages"):
        simulate_collective("parallel", workers=5000, nbytes=1.0)  # 25 million messages: refused, not attempted
    assert collectives.message_count("halving-doubling", 6) == len(collectives.messages("halving-doubling", 6)[2])
    for algorithm in ALGORITHMS:
        for N in (1, 2, 5, 8):
            assert collectives.message_count(algorithm, N) == len(collectives.messages(algorithm, N)[2])


@pytest.mark.parametrize("argv", [
    ["--latency", "inf"], ["--reduce-cost", "inf"], ["--latency", "-1"], ["--reduce-cost", "nan"],
    ["--bytes", "inf"], ["--bandwidth", "0"], ["--workers", "100000", "-a", "parallel"],
    ["--sweep", "2..8", "--latency", "inf"],
])
def test_cli_refuses_bad_numbers_with_one_line(argv, capsys, tmp_path):
    assert main(["collective", *argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and err.count("\n") == 1
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_fit_order_names_each_growth_and_refuses_what_is_no_power_law():
    N = np.array([2, 4, 8, 16, 32, 64], dtype=float)
    cases = {
        "3 N^1.5": (3 * N**1.5, "power", "N^1.50"),
        "2(N-1)": (2 * (N - 1), "leading power", "N"),
        "N(N-1)": (N * (N - 1), "leading power", "N^2"),
        "4(N-1)/N": (4 * (N - 1) / N, "leading power", "1"),
        "2 log2 N": (2 * np.log2(N), "log", "log N"),
        "constant": (0 * N + 7, "constant", "1"),
    }
    for name, (y, model, order) in cases.items():
        fit = collectives.fit_order(N, y)
        assert (fit.model, fit.order) == (model, order), name
        assert fit.r2 >= 0.999
    # halving-doubling over every N: 2 floor(log2 N) + 2 for non-powers of two: jagged, no power law fits
    ns = np.arange(2, 17, dtype=float)
    jagged = 2 * np.floor(np.log2(ns)) + 2 * (ns != 2 ** np.floor(np.log2(ns)))
    fit = collectives.fit_order(ns, jagged)
    assert fit.model == "none" and fit.order == "" and fit.r2 < 0.999 and "no power law" in fit.text()
    assert collectives.fit_order([2, 4], [1, 2]).model == "too few points"
    assert collectives.fit_order(N, 2 * (N - 1)).agrees("N") and not collectives.fit_order(N, 2 * (N - 1)).agrees("1")
    assert collectives.fit_order(N, 2 * np.log2(N)).agrees("log N") and not collectives.fit_order(N, N).agrees("log N")


def test_lecture_table_matches_every_expected_order():
    table = collectives.sweep(ALGORITHMS, [2, 4, 8, 16, 32], nbytes=1e6, latency=1e-5, bandwidth=1e9)
    orders = collectives.order_table(table)
    assert list(orders["lecture"][:5]) == ["parameter server", "sequential", "ring", "parallel", "recursive halving"]
    for _, row in orders.head(5).iterrows():
        for col, _ in collectives.MEASURES:
            assert row[f"{col}_agrees"], (row["algorithm"], col, row[f"{col}_fit"])
    ring = orders.set_index("algorithm").loc["ring"]
    halving = orders.set_index("algorithm").loc["halving-doubling"]
    assert ring["steps_fit"].order == "N" and halving["steps_fit"].order == "log N"  # the steps tell them apart
    parallel = orders.set_index("algorithm").loc["parallel"]
    assert parallel["total_bytes_fit"].order == "N^2" and parallel["steps_fit"].order == "1"


def test_cli_single_and_sweep(tmp_path, capsys):
    assert main(["collective", "--algorithm", "ring", "--workers", "4", "--bytes", "4000", "--bandwidth", "1000",
                 "--latency", "0.5", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["time"] == pytest.approx(closed_form("ring", 4, 4000))
    assert out["steps"] == 6 and out["complete"]
    assert main(["collective", "--sweep", "2..16", "--bytes", "1e6", "-o", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "The lecture's table" in text and "15 of 15 entries of the lecture's table agree" in text
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "O(log N) log N" in rows["recursive halving"] and "O(N^2)   ~N^2.00" in rows["parallel"]
    import pandas as pd

    table = pd.read_csv(tmp_path / "collectives.csv")
    assert set(table["algorithm"]) == set(ALGORITHMS) and sorted(set(table["workers"])) == [2, 4, 8, 16]
    assert (tmp_path / "collectives.png").stat().st_size > 10_000
    ps = table[table["algorithm"] == "ps"]
    assert collectives.fit_exponent(ps["workers"], ps["time"]) == pytest.approx(1.0, abs=0.05)
    assert main(["collective", "--workers", "0"]) == 2
    assert main(["collective", "--sweep", "2..8", "--bytes", "1e4", "--json", "-o", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    halving = next(o for o in out["orders"] if o["algorithm"] == "halving-doubling")
    assert halving["lecture"] == "recursive halving" and halving["steps"]["order"] == "log N"
    assert halving["steps"]["expected"] == "log N" and halving["steps"]["agrees"] is True
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
