"""All-reduce algorithms, simulated message by message on the network (simpy).

This module owns the collective communication model. Every algorithm is written
as a list of messages; nothing here evaluates a closed-form formula. The
simulation carries the data: each node holds, for every chunk of the vector, the
set of workers whose contribution has been summed into it, and a message
carries a snapshot of the sender's chunks at the moment it starts. A run is
``complete`` only if every worker ends holding every chunk reduced over all
workers, each exactly once, so a wrong algorithm fails instead of only being
slow or fast.

Network model (Thakur, Rabenseifner and Gropp, "Optimization of collective
communication operations in MPICH", IJHPCA 2005, section 2: the alpha-beta-gamma
model with a single port per direction):

- every node has one full-duplex NIC: it sends one message at a time and
  receives one message at a time (a send and a receive may overlap);
- a message of *n* bytes holds the sender's send port and the receiver's
  receive port together for ``latency + n / bandwidth`` seconds (alpha + n beta);
  a node sends its messages in program order and a busy receiver serves waiting
  senders first come, first served;
- a message that is reduced into the receiver's buffer makes its data usable
  ``reduce_cost * n`` seconds after it arrives (gamma per byte; default 0); a node
  reduces one message at a time, while its NIC goes on receiving (so sequential
  and ps expose only the last reduction, and trees of non-power-of-two size finish
  a little earlier than the round-by-round formula);
- a node sends its step-k messages only after every message it receives in
  steps before k has arrived (and been reduced).

Under this model the simulated times equal the textbook closed forms (checked in
``tests/test_collectives.py``), with N workers, n bytes, alpha, beta:

==================  ======================================================  =================
algorithm           time                                                    steps
==================  ======================================================  =================
ps                  2N (alpha + n beta): one extra server node, whose NIC    2
                    takes N pushes, then sends N pulls
ps-sharded          2 (S alpha + n beta) with S = N server nodes, each      2
                    owning n/S bytes (workers stagger their shard order)
sequential          2(N-1)(alpha + n beta): reduce to worker 0, broadcast   2(N-1)
parallel            2(N-1) alpha + 2(N-1)/N n beta: every worker reduces    2(N-1)
                    its 1/N share directly from all others, then sends it
ring                2(N-1) alpha + 2(N-1)/N n beta (+ (N-1)/N n gamma)      2(N-1)
halving-doubling    2 log2(N) alpha + 2(N-1)/N n beta for N = 2^k           2 log2 N
                    (Rabenseifner); other N: MPICH's fallback, the first    (+2)
                    2r ranks (r = N - 2^floor(log2 N)) fold pairwise first
                    and get the result back last: + 2 (alpha + n beta)
tree                2 ceil(log2 N) (alpha + n beta): binomial-tree reduce   2 ceil(log2 N)
                    to worker 0, then binomial-tree broadcast
==================  ======================================================  =================

Units: seconds, bytes, bytes per second; ``reduce_cost`` in seconds per byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from .errors import PipesimError

__all__ = ["ALGORITHMS", "CollectiveError", "CollectiveResult", "Message", "messages", "simulate_collective",
           "sweep", "plot_sweep", "fit_exponent"]

ALGORITHMS = ("ps", "ps-sharded", "sequential", "parallel", "ring", "halving-doubling", "tree")


class CollectiveError(PipesimError):
    """A collective that cannot be simulated: unknown algorithm, bad sizes or links."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One point-to-point message of an algorithm."""

    step: int
    """Algorithm round; the sender first waits for everything it receives in earlier rounds."""
    src: int
    dst: int
    chunks: tuple[int, ...]
    """Which of the vector's G equal chunks it carries."""
    reduce: bool
    """True: the receiver adds the data into its buffer; False: it overwrites (copies)."""


@dataclass(frozen=True, slots=True)
class CollectiveResult:
    algorithm: str
    workers: int
    """N, the workers that each contribute a vector and need the sum."""
    nodes: int
    """Workers plus server nodes (ps, ps-sharded)."""
    nbytes: float
    """n, bytes of each worker's vector."""
    time: float
    """Seconds from the first start to the last worker holding the full sum."""
    steps: int
    """Rounds of the algorithm (see the module docstring)."""
    peak_node_bytes: float
    """Bytes sent plus received by the busiest node."""
    total_bytes: float
    """Bytes carried by the network (sum over messages)."""
    messages: pd.DataFrame
    """One row per message: src, dst, step, start, end, bytes, reduce (nodes numbered 0..nodes-1)."""
    finish: list[float]
    """Per worker: when it holds the whole reduced vector (its data ready, reduction included)."""
    complete: bool
    """Every worker holds every chunk reduced over all workers exactly once."""
    problems: list[str] = field(default_factory=list)
    """Why the data is wrong (double counting, missing contributions), when it is."""

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "workers": self.workers, "nodes": self.nodes, "bytes": self.nbytes,
                "time": self.time, "steps": self.steps, "peak_node_bytes": self.peak_node_bytes,
                "total_bytes": self.total_bytes, "messages": len(self.messages), "complete": self.complete}


# ------------------------------------------------------------------ algorithms: lists of messages
def _ps(n: int) -> tuple[int, int, list[Message]]:
    server, everything = n, (0,)
    out = [Message(step=0, src=w, dst=server, chunks=everything, reduce=True) for w in range(n)]
    out += [Message(step=1, src=server, dst=w, chunks=everything, reduce=False) for w in range(n)]
    return 1, n + 1, out


def _ps_sharded(n: int, servers: int) -> tuple[int, int, list[Message]]:
    out = []
    for w in range(n):  # worker w pushes shard (w + i) mod S first: servers are not all hit at once
        out += [Message(step=0, src=w, dst=n + (w + i) % servers, chunks=((w + i) % servers,), reduce=True)
                for i in range(servers)]
    for s in range(servers):  # server s pulls back to worker (s + i) mod N first
        out += [Message(step=1, src=n + s, dst=(s + i) % n, chunks=(s,), reduce=False) for i in range(n)]
    return servers, n + servers, out


def _sequential(n: int) -> tuple[int, int, list[Message]]:
    out = [Message(step=w - 1, src=w, dst=0, chunks=(0,), reduce=True) for w in range(1, n)]
    out += [Message(step=n - 2 + w, src=0, dst=w, chunks=(0,), reduce=False) for w in range(1, n)]
    return 1, n, out


def _parallel(n: int) -> tuple[int, int, list[Message]]:
    # round r: worker i sends its share for owner (i + r) mod N; owners then send their sums back
    out = [Message(step=r - 1, src=i, dst=(i + r) % n, chunks=((i + r) % n,), reduce=True)
           for r in range(1, n) for i in range(n)]
    out += [Message(step=n - 2 + r, src=i, dst=(i + r) % n, chunks=(i,), reduce=False)
            for r in range(1, n) for i in range(n)]
    return n, n, out


def _ring(n: int) -> tuple[int, int, list[Message]]:
    # reduce-scatter: step k, worker i sends chunk (i - k) mod N to i + 1; then all-gather likewise
    out = [Message(step=k, src=i, dst=(i + 1) % n, chunks=((i - k) % n,), reduce=True)
           for k in range(n - 1) for i in range(n)]
    out += [Message(step=n - 1 + k, src=i, dst=(i + 1) % n, chunks=((i + 1 - k) % n,), reduce=False)
            for k in range(n - 1) for i in range(n)]
    return n, n, out


def _halving_doubling(n: int) -> tuple[int, int, list[Message]]:
    p = 1 << (n.bit_length() - 1)  # largest power of two <= N
    r = n - p
    everything = tuple(range(p))
    out: list[Message] = []
    step = 0
    # MPICH's fold for non-power-of-two N: among the first 2r ranks, even ranks hand their vector to
    # the odd neighbour and sit out; the p survivors are renumbered 0..p-1
    if r:
        out += [Message(step=0, src=2 * i, dst=2 * i + 1, chunks=everything, reduce=True) for i in range(r)]
        step = 1
    real = [2 * i + 1 for i in range(r)] + list(range(2 * r, n))  # survivor rank -> worker
    own = {v: (0, p) for v in range(p)}  # chunk range [lo, hi) each survivor is responsible for
    # reduce-scatter by recursive halving: distance p/2, p/4, ..., 1
    dist = p // 2
    halving: list[tuple[int, int]] = []
    while dist >= 1:
        new = {}
        for v in range(p):
            partner = v ^ dist
            lo, hi = own[v]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v < partner else ((mid, hi), (lo, mid))
            out.append(Message(step=step, src=real[v], dst=real[partner], chunks=tuple(range(*give)), reduce=True))
            new[v] = keep
        own = new
        halving.append((step, dist))
        step += 1
        dist //= 2
    # all-gather by recursive doubling: distance 1, 2, ..., p/2, each sends everything it holds
    dist = 1
    while dist < p:
        new = {}
        for v in range(p):
            partner = v ^ dist
            lo, hi = own[v]
            plo, phi = own[partner]
            out.append(Message(step=step, src=real[v], dst=real[partner], chunks=tuple(range(lo, hi)), reduce=False))
            new[v] = (min(lo, plo), max(hi, phi))
        own = new
        step += 1
        dist *= 2
    if r:  # hand the result back to the ranks that sat out
        out += [Message(step=step, src=2 * i + 1, dst=2 * i, chunks=everything, reduce=False) for i in range(r)]
    return p, n, out


def _tree(n: int) -> tuple[int, int, list[Message]]:
    levels = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    out = []
    for j in range(levels):  # binomial reduce: at level j, ranks i = 2^j mod 2^(j+1) send to i - 2^j
        span = 1 << j
        out += [Message(step=j, src=i, dst=i - span, chunks=(0,), reduce=True)
                for i in range(n) if i % (2 * span) == span]
    for j in range(levels):  # binomial broadcast from rank 0: halving distances
        span = 1 << (levels - 1 - j)
        out += [Message(step=levels + j, src=i, dst=i + span, chunks=(0,), reduce=False)
                for i in range(0, n, 2 * span) if i + span < n]
    return 1, n, out


def messages(algorithm: str, workers: int, *, servers: int | None = None) -> tuple[int, int, list[Message]]:
    """The algorithm as data: (chunks G, nodes, messages). Workers are nodes 0..N-1, servers follow."""
    if algorithm not in ALGORITHMS:
        raise CollectiveError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CollectiveError(f"workers must be a positive integer, got {workers!r}")
    if workers == 1 and algorithm not in ("ps", "ps-sharded"):
        return 1, 1, []
    if algorithm == "ps":
        return _ps(workers)
    if algorithm == "ps-sharded":
        servers = workers if servers is None else servers
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise CollectiveError(f"servers must be a positive integer, got {servers!r}")
        return _ps_sharded(workers, servers)
    return {"sequential": _sequential, "parallel": _parallel, "ring": _ring,
            "halving-doubling": _halving_doubling, "tree": _tree}[algorithm](workers)


# ------------------------------------------------------------------ the simulation
def _link(value, a: int, b: int) -> float:
    return value if isinstance(value, (int, float)) else value[a][b]


def simulate_collective(algorithm: str, *, workers: int, nbytes: float, latency=0.0, bandwidth=math.inf,
                        reduce_cost: float = 0.0, servers: int | None = None,
                        start_times: Sequence[float] | None = None) -> CollectiveResult:
    """All-reduce *nbytes* over *workers* with *algorithm*, message by message.

    *latency* (s) and *bandwidth* (bytes/s) are numbers, or nodes x nodes matrices
    (row = sender). *start_times*: per worker, when its vector is ready (default 0);
    a worker sends nothing before it. *servers*: server nodes of ``ps-sharded``
    (default N).
    """
    if not nbytes >= 0 or math.isinf(nbytes):
        raise CollectiveError(f"bytes must be a finite number >= 0, got {nbytes!r}")
    if not reduce_cost >= 0:
        raise CollectiveError(f"reduce_cost must be >= 0 seconds per byte, got {reduce_cost!r}")
    G, nodes, msgs = messages(algorithm, workers, servers=servers)
    for name, value in (("latency", latency), ("bandwidth", bandwidth)):
        if isinstance(value, (int, float)):
            bad = value < 0 if name == "latency" else not value > 0
            if bad or math.isnan(value):
                raise CollectiveError(f"{name} must be {'>= 0' if name == 'latency' else '> 0'}, got {value!r}")
        elif len(value) != nodes or any(len(row) != nodes for row in value):
            raise CollectiveError(f"{name} must be a number or a {nodes}x{nodes} matrix for {algorithm!r}")
    starts = [0.0] * workers if start_times is None else [float(t) for t in start_times]
    if len(starts) != workers:
        raise CollectiveError(f"start_times has {len(starts)} entries for {workers} workers")
    starts += [0.0] * (nodes - workers)  # server nodes are ready at once
    chunk = nbytes / G

    env = simpy.Environment()
    recv_port = [simpy.Resource(env, capacity=1) for _ in range(nodes)]
    reducer = [simpy.Resource(env, capacity=1) for _ in range(nodes)]
    log: list[tuple[int, int]] = []  # (1 send | 0 arrival, message) in the order the simulation ran them
    arrived = [env.event() for _ in msgs]
    timing = [(0.0, 0.0)] * len(msgs)
    outgoing: list[list[int]] = [[] for _ in range(nodes)]
    incoming_by_step: list[dict[int, list[int]]] = [{} for _ in range(nodes)]
    for i, m in enumerate(msgs):
        outgoing[m.src].append(i)
        incoming_by_step[m.dst].setdefault(m.step, []).append(i)

    def sender(node: int):
        if starts[node] > 0:
            yield env.timeout(starts[node])
        earlier = sorted(incoming_by_step[node])
        waited = 0  # steps of incoming messages already waited for
        for i in sorted(outgoing[node], key=lambda i: msgs[i].step):  # stable: program order within a step
            m = msgs[i]
            need = [arrived[j] for s in earlier[waited:] if s < m.step for j in incoming_by_step[node][s]]
            waited += sum(1 for s in earlier[waited:] if s < m.step)
            if need:
                yield env.all_of(need)
            size = chunk * len(m.chunks)
            with recv_port[m.dst].request() as req:
                yield req
                t0 = env.now
                log.append((1, i))  # the payload is what the sender holds now
                bw = _link(bandwidth, m.src, m.dst)
                yield env.timeout(_link(latency, m.src, m.dst) + (size / bw if size > 0 else 0.0))
            timing[i] = (t0, env.now)
            env.process(_deliver(i, reduce_cost * size if m.reduce else 0.0))

    def _deliver(i: int, delay: float):
        if delay > 0:  # one reduction at a time per node; receiving goes on meanwhile
            with reducer[msgs[i].dst].request() as req:
                yield req
                yield env.timeout(delay)
        log.append((0, i))
        arrived[i].succeed(env.now)

    for node in range(nodes):
        env.process(sender(node))
    env.run()

    return _result(algorithm, workers, nodes, nbytes, G, chunk, msgs, timing, arrived, starts, log)


def _result(algorithm, workers, nodes, nbytes, G, chunk, msgs, timing, arrived, starts, log) -> CollectiveResult:
    # replay the data in the order the simulation ran: a send snapshots its sender's chunks,
    # an arrival (after its reduction) adds them into (or copies them over) the receiver's
    full = (1 << workers) - 1
    held = [[1 << w] * G if w < workers else [0] * G for w in range(nodes)]  # contributors per chunk, bit masks
    ready_at = [arrived[i].value for i in range(len(msgs))]
    payload: dict[int, list[int]] = {}
    problems: list[str] = []
    for kind, i in log:
        m = msgs[i]
        if kind == 1:
            payload[i] = [held[m.src][c] for c in m.chunks]
            continue
        for c, mask in zip(m.chunks, payload.pop(i)):
            if m.reduce:
                if held[m.dst][c] & mask and len(problems) < 5:
                    problems.append(f"step {m.step}: node {m.dst} adds contributions twice into chunk {c}")
                held[m.dst][c] |= mask
            else:
                held[m.dst][c] = mask
    for w in range(workers):
        missing = [c for c in range(G) if held[w][c] != full]
        if missing and len(problems) < 10:
            problems.append(f"worker {w} ends without the full sum of chunks {missing[:8]}")
    finish = list(starts[:workers])
    for i, m in enumerate(msgs):
        if m.dst < workers:
            finish[m.dst] = max(finish[m.dst], ready_at[i])
    df = pd.DataFrame({
        "src": [m.src for m in msgs], "dst": [m.dst for m in msgs], "step": [m.step for m in msgs],
        "start": [t[0] for t in timing], "end": [t[1] for t in timing],
        "bytes": [chunk * len(m.chunks) for m in msgs], "reduce": [m.reduce for m in msgs],
    }, columns=["src", "dst", "step", "start", "end", "bytes", "reduce"])
    per_node = np.zeros(nodes)
    np.add.at(per_node, df["src"].to_numpy(dtype=np.int64), df["bytes"].to_numpy(dtype=float))
    np.add.at(per_node, df["dst"].to_numpy(dtype=np.int64), df["bytes"].to_numpy(dtype=float))
    t0 = min(starts[:workers]) if workers else 0.0
    return CollectiveResult(
        algorithm=algorithm, workers=workers, nodes=nodes, nbytes=float(nbytes),
        time=max(finish) - t0 if finish else 0.0, steps=(max(m.step for m in msgs) + 1) if msgs else 0,
        peak_node_bytes=float(per_node.max()) if nodes else 0.0, total_bytes=float(df["bytes"].sum()),
        messages=df, finish=finish, complete=not problems, problems=problems)


# ------------------------------------------------------------------ sweeps and the lecture's figure
def sweep(algorithms: Sequence[str], workers: Sequence[int], *, nbytes: float, latency: float = 0.0,
          bandwidth: float = math.inf, reduce_cost: float = 0.0) -> pd.DataFrame:
    """One row per (algorithm, N): time, steps, peak_node_bytes, total_bytes, complete."""
    rows = []
    for algorithm in algorithms:
        for n in workers:
            r = simulate_collective(algorithm, workers=n, nbytes=nbytes, latency=latency, bandwidth=bandwidth,
                                    reduce_cost=reduce_cost)
            rows.append({"algorithm": algorithm, "workers": n, "bytes": float(nbytes), "time": r.time,
                         "steps": r.steps, "peak_node_bytes": r.peak_node_bytes, "total_bytes": r.total_bytes,
                         "complete": r.complete})
    return pd.DataFrame(rows)


def fit_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """Slope of log y against log x (least squares): y ~ c x^slope. NaN when it cannot be fitted."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = (x > 0) & (y > 0)
    if ok.sum() < 2 or len(set(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


_METRICS = (("time", "time (s)"), ("peak_node_bytes", "peak node traffic (bytes)"),
            ("total_bytes", "total network traffic (bytes)"))


def plot_sweep(table: pd.DataFrame, *, title: str | None = None):
    """Log-log panels of time, peak node bytes and total bytes against N, one line per algorithm.

    The legend gives each line's fitted exponent (y ~ N^k). Returns the matplotlib Figure.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 5.2), layout="constrained")
    axes = fig.subplots(1, 3)
    markers = "osD^v<>p"
    for ax, (col, label) in zip(axes, _METRICS):
        for i, (algorithm, rows) in enumerate(table.groupby("algorithm", sort=False)):
            rows = rows.sort_values("workers")
            k = fit_exponent(rows["workers"], rows[col])
            ax.loglog(rows["workers"], rows[col], marker=markers[i % len(markers)], ms=4,
                      label=f"{algorithm} (N^{k:.2f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers N")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, title="algorithm (fitted exponent)", title_fontsize=8)
    nbytes = table["bytes"].iloc[0] if len(table) else 0
    fig.suptitle(title or f"All-reduce of {nbytes:.3g} bytes, simulated message by message")
    return fig
