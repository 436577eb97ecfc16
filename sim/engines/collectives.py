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
parallel            (N-1)(alpha + n beta) (+ n gamma): the lecture's "all   1
                    reductions at once", every worker sends its whole
                    vector to every other and adds up what it receives
direct              2(N-1) alpha + 2(N-1)/N n beta: direct reduce-scatter   2(N-1)
                    then all-gather, every worker reduces its 1/N share
                    straight from all others, then sends it to all
ring                2(N-1) alpha + 2(N-1)/N n beta (+ (N-1)/N n gamma)      2(N-1)
halving-doubling    2 log2(N) alpha + 2(N-1)/N n beta for N = 2^k           2 log2 N
                    (Rabenseifner); other N: MPICH's fallback, the first    (+2)
                    2r ranks (r = N - 2^floor(log2 N)) fold pairwise first
                    and get the result back last: + 2 (alpha + n beta)
tree                2 ceil(log2 N) (alpha + n beta): binomial-tree reduce   2 ceil(log2 N)
                    to worker 0, then binomial-tree broadcast
==================  ======================================================  =================

The lecture's comparison (:data:`LECTURE`) counts, as N grows: *time* in steps (rounds of
messages one after the other), *peak node bandwidth* in bytes sent plus received by the
busiest node, and *total bandwidth* in bytes carried by the network. With the single-port
NIC above, a step can hold several messages of one node one after the other, so the
lecture's ``parallel`` (one step, O(N^2) bytes) still takes (N-1) message times in seconds.
:func:`fit_order` fits the growth of a measured column and says when no power law fits.

Units: seconds, bytes, bytes per second; ``reduce_cost`` in seconds per byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from sim.errors import PipesimError

__all__ = ["ALGORITHMS", "LECTURE", "MAX_MESSAGES", "CollectiveError", "CollectiveResult", "Message", "messages",
           "message_count", "simulate_collective", "sweep", "fit_exponent", "fit_order", "OrderFit",
           "order_table"]

# the lecture's five rows first (in its order), then the others
ALGORITHMS = ("ps", "sequential", "ring", "parallel", "halving-doubling", "ps-sharded", "direct", "tree")

# The lecture's table (seed lecture 13): row name, algorithm, and the expected growth in N of
# time (steps), peak node bandwidth and total bandwidth. "1", "log N", "N", "N^2" stand for O(.)
LECTURE = (
    ("parameter server", "ps", ("1", "N", "N")),
    ("sequential", "sequential", ("N", "N", "N")),
    ("ring", "ring", ("N", "1", "N")),
    ("parallel", "parallel", ("1", "N", "N^2")),
    ("recursive halving", "halving-doubling", ("log N", "1", "N")),
)

MAX_MESSAGES = 250_000
"""Most messages one simulation may hold: simpy handles about 20,000 a second here, so this is ~15 s."""


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
    own: bool = False
    """True: the sender sends its own input vector (kept apart from the sums it receives), not what it holds now."""


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
    # the lecture's "all reductions at once": in one step every worker sends its own whole vector to every other
    # worker (to i+1 first, then i+2, ...: no two senders hit one receiver at once) and sums what arrives
    out = [Message(step=0, src=i, dst=(i + r) % n, chunks=(0,), reduce=True, own=True)
           for r in range(1, n) for i in range(n)]
    return 1, n, out


def _direct(n: int) -> tuple[int, int, list[Message]]:
    # direct reduce-scatter + all-gather: round r, worker i sends its share for owner (i + r) mod N;
    # owners then send their sums back
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
    if servers is not None and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
        raise CollectiveError(f"servers must be a positive integer, got {servers!r}")
    count = message_count(algorithm, workers, servers=servers)
    if count > MAX_MESSAGES:
        raise CollectiveError(f"{algorithm} over {workers} workers sends {count:,} messages; the message-by-message "
                              f"simulation takes at most {MAX_MESSAGES:,} (use fewer workers)")
    if workers == 1 and algorithm not in ("ps", "ps-sharded"):
        return 1, 1, []
    if algorithm == "ps":
        return _ps(workers)
    if algorithm == "ps-sharded":
        return _ps_sharded(workers, workers if servers is None else servers)
    return {"sequential": _sequential, "parallel": _parallel, "direct": _direct, "ring": _ring,
            "halving-doubling": _halving_doubling, "tree": _tree}[algorithm](workers)


def message_count(algorithm: str, workers: int, *, servers: int | None = None) -> int:
    """How many messages :func:`messages` makes, without making them (to refuse a run too big to simulate)."""
    n = workers
    if n == 1 and not algorithm.startswith("ps"):
        return 0
    p = 1 << (n.bit_length() - 1)
    return {"ps": 2 * n, "ps-sharded": 2 * n * (servers or n), "sequential": 2 * (n - 1), "tree": 2 * (n - 1),
            "parallel": n * (n - 1), "direct": 2 * n * (n - 1), "ring": 2 * n * (n - 1),
            "halving-doubling": 2 * p * (p.bit_length() - 1) + 2 * (n - p)}[algorithm]


# ------------------------------------------------------------------ the simulation
_LINK_RULES = {"latency": ("a finite number >= 0 (seconds)",),
               "bandwidth": ("a number > 0 (bytes per second; inf: unlimited)", True)}


def _check_number(name: str, value, rule: str, infinite_ok: bool = False) -> None:
    """Refuse NaN, negative, and (unless *infinite_ok*) infinite values; bandwidth must also be > 0."""
    bad = (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0
           or (math.isinf(value) and not infinite_ok) or (infinite_ok and value == 0))
    if bad:
        raise CollectiveError(f"{name} must be {rule}, got {value!r}")


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
    _check_number("bytes", nbytes, "a finite number >= 0")
    _check_number("reduce_cost", reduce_cost, "a finite number >= 0 (seconds per byte)")
    G, nodes, msgs = messages(algorithm, workers, servers=servers)
    for name, value in (("latency", latency), ("bandwidth", bandwidth)):
        if isinstance(value, (int, float)):
            _check_number(name, value, *_LINK_RULES[name])
        elif len(value) != nodes or any(len(row) != nodes for row in value):
            raise CollectiveError(f"{name} must be a number or a {nodes}x{nodes} matrix for {algorithm!r}")
        else:
            for row in value:
                for v in row:
                    _check_number(name, v, *_LINK_RULES[name])
    starts = [0.0] * workers if start_times is None else list(start_times)
    for t in starts:
        _check_number("start_times", t, "finite numbers >= 0 (seconds)")
    starts = [float(t) for t in starts]
    if len(starts) != workers:
        raise CollectiveError(f"start_times has {len(starts)} entries for {workers} workers")
    starts += [0.0] * (nodes - workers)  # server nodes are ready at once
    _check_totals(len(msgs), nbytes, latency, bandwidth, reduce_cost, max(starts))
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


def _check_totals(count: int, nbytes: float, latency, bandwidth, reduce_cost: float, start: float) -> None:
    """Refuse inputs whose totals pass the largest float, before printing inf or nan: no message carries more
    than the whole vector, so *count* messages bound every byte total and (added end to end) every time."""
    def extreme(value, pick):
        return value if isinstance(value, (int, float)) else pick(v for row in value for v in row)

    per_message = extreme(latency, max) + nbytes / extreme(bandwidth, min) + reduce_cost * nbytes
    if not math.isfinite(2.0 * count * nbytes):
        raise CollectiveError(f"{count} messages of up to {nbytes:g} bytes add up past the largest float; "
                              f"check the bytes per worker (a gradient or weight size) for a typo")
    if not math.isfinite(start + count * per_message):
        raise CollectiveError(f"the all-reduce time overflows: {count} messages of latency + bytes / bandwidth + "
                              f"reduce_cost x bytes pass the largest float; check these numbers for a typo")


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
            if m.own and m.src >= workers and len(problems) < 5:
                problems.append(f"step {m.step}: server node {m.src} has no input vector of its own to send")
            payload[i] = [(1 << m.src) if m.own else held[m.src][c] for c in m.chunks]
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


# ------------------------------------------------------------------ sweeps and the lecture's table
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


_R2_MIN = 0.999     # a model "fits" when it explains this share of the variance of log y
_RMS_SLACK = 0.002  # ... and a simpler model is preferred while its RMS error in log y stays this close (0.2%)


@dataclass(frozen=True, slots=True)
class OrderFit:
    """How a measured column grows with N, and how well that is known.

    Models tried, simplest first (each fitted by least squares, judged by R^2 of log y):
    ``constant``; ``power`` y = c N^k (a line in log-log); ``log`` y = a + b log N;
    ``leading power`` y = c N^k + b N^(k-1) (k on a grid of 0.005, needs 4 points): the
    leading term and the next one, as 2(N-1) (k = 1), N(N-1) (k = 2) and 4(N-1)/N (k = 0,
    a constant) are written. The simplest model whose
    R^2 >= 0.999 and whose error is within 0.2% of the best one's is chosen; when no model
    reaches R^2 0.999, ``model`` is ``"none"`` and :attr:`order` is empty.
    """

    model: str
    """'constant', 'power', 'log', 'leading power', 'none' or 'too few points'."""
    exponent: float
    """k of the chosen power law (0 for a constant; NaN for log N or no fit)."""
    r2: float
    """R^2 of the chosen model (of the best one tried when none fits), in log y."""

    @property
    def order(self) -> str:
        """The growth as the lecture writes it inside O(.): '1', 'log N', 'N', 'N^2', 'N^1.37'; '' if unknown."""
        if self.model in ("none", "too few points"):
            return ""
        if self.model == "log":
            return "log N"
        if abs(self.exponent) <= 0.05:
            return "1"
        k = round(self.exponent)
        if abs(self.exponent - k) <= 0.05:
            return "N" if k == 1 else f"N^{k}"
        return f"N^{self.exponent:.2f}"

    def text(self) -> str:
        """A short cell for a table: the order with the fitted exponent, or why there is none."""
        if self.model == "too few points":
            return "n/a (too few N)"
        if self.model == "none":
            return f"no power law (R2 {self.r2:.4f})"
        if self.model == "constant":
            return "1 (constant)"
        if self.model == "log":
            return "log N"
        prefix = "~" if self.model == "leading power" else ""  # ~: to leading order
        return f"{prefix}N^{self.exponent:.2f}"

    def agrees(self, expected: str) -> bool:
        """Whether the fit says the same as the lecture's *expected* order ('1', 'log N', 'N', 'N^2')."""
        if expected == "log N" or self.model == "log":
            return expected == "log N" and self.model == "log"
        want = {"1": 0.0, "N": 1.0}.get(expected)
        want = float(expected.split("^")[1]) if want is None else want
        return bool(self.order) and abs(self.exponent - want) <= 0.15


def _r2_log(logy: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(R^2, RMS) of predictions *pred* (in y) against log y; -inf when a prediction is not positive."""
    if not (pred > 0).all():
        return -math.inf, math.inf
    res = logy - np.log(pred)
    total = float(((logy - logy.mean()) ** 2).sum())
    rms = float(np.sqrt((res**2).mean()))
    return (1.0 - float((res**2).sum()) / total if total > 0 else 1.0), rms


def fit_order(x: Sequence[float], y: Sequence[float]) -> OrderFit:
    """How *y* grows with *x* (= N): see :class:`OrderFit`. Points with x or y <= 0 are left out."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(np.unique(x)) < 3:
        return OrderFit("too few points", math.nan, math.nan)
    if y.max() <= y.min() * (1 + 1e-9):
        return OrderFit("constant", 0.0, 1.0)
    logx, logy = np.log(x), np.log(y)
    w = 1.0 / y  # weighted least squares in y: relative errors, as the log-space judgement
    fits = []  # (params, model, exponent, r2, rms), simplest first
    k, c = np.polyfit(logx, logy, 1)
    fits.append((2, "power", float(k), *_r2_log(logy, np.exp(c) * x**k)))
    design = np.column_stack([np.ones_like(x), logx])
    coef = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)[0]
    if coef[1] > 0:
        fits.append((2, "log", math.nan, *_r2_log(logy, design @ coef)))
    if len(np.unique(x)) >= 4:  # leading power and its next term: 2(N-1), N(N-1), 4(N-1)/N fit exactly
        best = None
        for k in np.round(np.arange(-1.0, 3.0005, 0.005), 3):
            design = np.column_stack([x**k, x ** (k - 1)])
            coef = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)[0]
            if coef[0] <= 0:
                continue
            r2, rms = _r2_log(logy, design @ coef)
            if best is None or rms < best[4]:
                best = (3, "leading power", float(k), r2, rms)
        if best is not None:
            fits.append(best)
    best_rms = min(f[4] for f in fits)
    for _, model, exponent, r2, rms in fits:
        if r2 >= _R2_MIN and rms <= best_rms + _RMS_SLACK:
            return OrderFit(model, exponent, r2)
    return OrderFit("none", math.nan, max(f[3] for f in fits))


MEASURES = (("steps", "time (steps)"), ("peak_node_bytes", "peak node bandwidth (bytes)"),
            ("total_bytes", "total bandwidth (bytes)"))
"""The lecture's three columns and what pipesim measures for each."""


def order_table(table: pd.DataFrame) -> pd.DataFrame:
    """The lecture's comparison from a :func:`sweep` table: one row per algorithm.

    Columns: ``algorithm``, ``lecture`` (its row name, '' for algorithms the lecture does not
    list), and per measure m of :data:`MEASURES` plus ``time`` (seconds): ``m_expected``
    (the lecture's order, '' when it gives none), ``m_fit`` (:class:`OrderFit`) and ``m_agrees``.
    """
    names = {alg: (row, orders) for row, alg, orders in LECTURE}
    rows = []
    for algorithm, sub in table.groupby("algorithm", sort=False):
        sub = sub.sort_values("workers")
        row, orders = names.get(algorithm, ("", ("", "", "")))
        out = {"algorithm": algorithm, "lecture": row}
        for (col, _), expected in zip(MEASURES + (("time", ""),), orders + ("",)):
            fit = fit_order(sub["workers"], sub[col])
            out.update({f"{col}_expected": expected, f"{col}_fit": fit,
                        f"{col}_agrees": fit.agrees(expected) if expected else None})
        rows.append(out)
    rank = {alg: i for i, (_, alg, _) in enumerate(LECTURE)}
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values("algorithm", key=lambda s: s.map(lambda a: rank.get(a, len(rank))), kind="stable")
    return frame.reset_index(drop=True)


