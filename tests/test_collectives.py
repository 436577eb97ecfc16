"""Collectives: simulated times against the alpha-beta closed forms, and the data each worker ends with."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import collectives
from sim.cli import main
from sim.collectives import ALGORITHMS, CollectiveError, Message, simulate_collective

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
        "parallel": 2 * (N - 1) * a + 2 * (N - 1) / N * n * b + (N - 1) / N * n * g,
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


@pytest.mark.parametrize("algorithm", ["ring", "halving-doubling", "tree", "sequential", "ps", "parallel"])
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


def test_errors():
    with pytest.raises(CollectiveError, match="choose one of"):
        simulate_collective("butterfly", workers=4, nbytes=1)
    with pytest.raises(CollectiveError, match="workers"):
        simulate_collective("ring", workers=0, nbytes=1)
    with pytest.raises(CollectiveError, match="bandwidth"):
        simulate_collective("ring", workers=2, nbytes=1, bandwidth=0)


def test_cli_single_and_sweep(tmp_path, capsys):
    assert main(["collective", "--algorithm", "ring", "--workers", "4", "--bytes", "4000", "--bandwidth", "1000",
                 "--latency", "0.5", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["time"] == pytest.approx(closed_form("ring", 4, 4000))
    assert out["steps"] == 6 and out["complete"]
    assert main(["collective", "--sweep", "2..8", "--bytes", "1e6", "-o", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "fitted exponents" in text
    import pandas as pd

    table = pd.read_csv(tmp_path / "collectives.csv")
    assert set(table["algorithm"]) == set(ALGORITHMS) and sorted(set(table["workers"])) == [2, 4, 8]
    assert (tmp_path / "collectives.png").stat().st_size > 10_000
    ps = table[table["algorithm"] == "ps"]
    assert collectives.fit_exponent(ps["workers"], ps["time"]) == pytest.approx(1.0, abs=0.05)
    assert main(["collective", "--workers", "0"]) == 2
