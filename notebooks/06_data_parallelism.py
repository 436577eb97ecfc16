# %% [markdown]
# # 6. Data parallelism: parameter server vs all-reduce
#
# Pipelines split the *model*. Data parallelism splits the *batch*: N workers each hold a full copy of the model,
# each computes the gradient of its share of the batch, and before the update every worker needs the **sum** of
# all N gradients (notebook 2: summing per-sample gradients gives the batch gradient). Summing n bytes held by
# each of N workers, and giving the result to all of them, is an **all-reduce**.
#
# How long it takes depends on the algorithm. `sim.engines.collectives` simulates each one message by message, with the
# α-β model of Thakur, Rabenseifner and Gropp (*Optimization of Collective Communication Operations in MPICH*,
# IJHPCA 2005): a message of n bytes costs α + n β (α: latency, β: seconds per byte), and every node sends one
# message and receives one message at a time. The simulation also carries the data, so an algorithm that sums
# something twice or forgets a worker is reported as incomplete, not just timed.

# %%
# %matplotlib inline
import pandas as pd

from sim.engines.collectives import ALGORITHMS, order_table, simulate_collective, sweep
from sim.io.sweep_plots import collective_sweep_plot

print(ALGORITHMS)

# %% [markdown]
# ## The algorithms
#
# - **ps** (parameter server): every worker pushes its gradient to one server, which sums and sends the result
#   back. Simple, but the server's network port carries 2N messages of n bytes.
# - **ps-sharded**: N servers, each owning 1/N of the vector: the traffic is spread.
# - **sequential**: worker 0 plays the server: the others send to it one after the other, then it sends the sum
#   back to each, one after the other.
# - **parallel** (the lecture's "all reductions at once"): in one step every worker sends its whole vector to every
#   other worker and adds up the N-1 vectors it receives. One step, but N(N-1) · n bytes on the network.
# - **direct**: cut the vector into N shares; worker i collects and sums share i from everybody, then sends the
#   finished share to everybody (a direct reduce-scatter and all-gather, N-1 rounds each way).
# - **ring**: cut the vector into N chunks; in N-1 steps every worker sends one chunk to its neighbour and adds the
#   one it receives (reduce-scatter), then N-1 more steps pass the finished chunks around (all-gather)
#   (Patarasuk and Yuan, *Bandwidth optimal all-reduce algorithms for clusters of workstations*, JPDC 2009).
# - **halving-doubling** (Rabenseifner): the same two phases in log2 N steps, pairing workers at distance
#   N/2, N/4, ...
# - **tree**: a binomial tree reduces to worker 0 in log2 N steps, then broadcasts back.
#
# ## The complexity table, measured
#
# We measure the two terms of the time separately: once with α = 1 and free bandwidth (the coefficient of α),
# once with α = 0 and n β = 1 (the coefficient of n β). We also count the bytes through the busiest node and the
# bytes on the whole network, in units of n.
#
# (A vector of n bytes; N workers; one column per measured quantity.)

# %%
rows = []
for alg in ALGORITHMS:
    for N in [2, 4, 8, 16, 32]:
        lat = simulate_collective(alg, workers=N, nbytes=0.0, latency=1.0)               # alpha = 1, beta = 0
        bw = simulate_collective(alg, workers=N, nbytes=1.0, latency=0.0, bandwidth=1.0)  # alpha = 0, n beta = 1
        assert lat.complete and bw.complete, (alg, N, bw.problems)
        rows.append({"algorithm": alg, "N": N, "alpha_terms": lat.time, "nbeta_terms": bw.time,
                     "busiest_node": bw.peak_node_bytes, "network_total": bw.total_bytes})
table = pd.DataFrame(rows)
print(table[table.N.isin([4, 16])].to_string(index=False))

# %% [markdown]
# The measured coefficients match the textbook table (Thakur et al. 2005; Patarasuk and Yuan 2009):
#
# | algorithm | α terms | n β terms | busiest node sends + receives | time grows with N as |
# |---|---|---|---|---|
# | ps | 2N | 2N | 2N · n (the server) | N |
# | ps-sharded | 2N | 2 | 2n | N (latency only) |
# | sequential | 2(N-1) | 2(N-1) | 2(N-1) · n (worker 0) | N |
# | parallel | N-1 | N-1 | 2(N-1) · n | N |
# | direct | 2(N-1) | 2(N-1)/N | 4(N-1)/N · n | N (latency only) |
# | ring | 2(N-1) | 2(N-1)/N | 4(N-1)/N · n | N (latency only) |
# | halving-doubling | 2 log2 N | 2(N-1)/N | 4(N-1)/N · n | log N (latency only) |
# | tree | 2 log2 N | 2 log2 N | 2 log2 N · n | log N |
#
# The next cell checks every entry of this table against the simulation, for N = 2 ... 32.

# %%
import math

expected = {
    "ps": lambda N: (2 * N, 2 * N, 2 * N),
    "ps-sharded": lambda N: (2 * N, 2, 2),
    "sequential": lambda N: (2 * (N - 1), 2 * (N - 1), 2 * (N - 1)),
    "parallel": lambda N: (N - 1, N - 1, 2 * (N - 1)),  # one step, but each port takes N-1 whole vectors in turn
    "direct": lambda N: (2 * (N - 1), 2 * (N - 1) / N, 4 * (N - 1) / N),
    "ring": lambda N: (2 * (N - 1), 2 * (N - 1) / N, 4 * (N - 1) / N),
    "halving-doubling": lambda N: (2 * math.log2(N), 2 * (N - 1) / N, 4 * (N - 1) / N),
    "tree": lambda N: (2 * math.log2(N), 2 * math.log2(N), 2 * math.log2(N)),
}
for r in table.itertuples():
    alpha_terms, nbeta_terms, busiest = expected[r.algorithm](r.N)
    assert abs(r.alpha_terms - alpha_terms) < 1e-9, (r.algorithm, r.N)
    assert abs(r.nbeta_terms - nbeta_terms) < 1e-9, (r.algorithm, r.N)
    assert abs(r.busiest_node - busiest) < 1e-9, (r.algorithm, r.N)
print("all", len(table), "rows match the table")

# %% [markdown]
# ## The lecture's table
#
# The lecture compares five of them by how three quantities grow with N: *time* counted in steps (rounds of
# messages that must follow each other), the *peak node bandwidth* (bytes through the busiest node) and the
# *total bandwidth* (bytes on the whole network):
#
# | | time (steps) | peak node bandwidth | total bandwidth |
# |---|---|---|---|
# | parameter server | O(1) | O(N) | O(N) |
# | sequential | O(N) | O(N) | O(N) |
# | ring | O(N) | O(1) | O(N) |
# | parallel | O(1) | O(N) | O(N²) |
# | recursive halving | O(log N) | O(1) | O(N) |
#
# `order_table` fits the growth of each simulated column (`sim.engines.collectives.fit_order`: a power law c N^k, the
# leading power with its next term c N^k + b N^(k-1), or a + b log N, whichever is simplest with R² ≥ 0.999) and
# compares it with the lecture. `pipesim collective --sweep 2..64` prints the same table.

# %%
big = sweep(ALGORITHMS, [2, 4, 8, 16, 32], nbytes=100e6, latency=10e-6, bandwidth=10e9)
orders = order_table(big)
columns = ["steps", "peak_node_bytes", "total_bytes"]
for row in orders.head(5).itertuples():
    cells = [f"O({getattr(row, c + '_expected')}): {getattr(row, c + '_fit').text()}" for c in columns]
    print(f"{row.lecture:<18}", " | ".join(f"{c:<22}" for c in cells))
    assert all(getattr(row, c + "_agrees") for c in columns), row.algorithm
print("every entry of the lecture's table agrees with the simulation")

# %% [markdown]
# The same measurements as curves, with realistic numbers (100 MB of gradients, 10 µs latency, 10 GB/s links).
# Each legend gives the fitted growth of each line. In steps, the ring (N) and halving-doubling (log N) part;
# in seconds they lie on top of each other: both are bandwidth-optimal. The lecture's parallel takes one step,
# but in seconds it grows like N: a node's port still takes the N-1 vectors one after the other.

# %%
collective_sweep_plot(big, title="All-reduce of 100 MB over 10 GB/s links, 10 µs latency (simulated)")

# %% [markdown]
# What to take away:
#
# - the **parameter server** is the bottleneck: its time grows linearly with N because one port carries
#   everything. Sharding the server fixes the bandwidth term.
# - **ring** and **halving-doubling** are *bandwidth-optimal*: each node sends and receives 2(N-1)/N · n, about
#   twice its gradient, whatever N. This is why data parallelism scales: the all-reduce of a large gradient takes
#   almost the same time on 8 or on 1000 workers (given a good network).
# - for **small messages** the α terms dominate, and the log2 N algorithms (tree, halving-doubling) win over the
#   ring's 2(N-1) steps.
#
# ## Exercises
#
# **Exercise 1.** With N = 16, α = 10 µs and β = 1/(10 GB/s), from which message size n is the ring faster than the
# tree?
#
# <details><summary>Answer</summary>
#
# Ring: 30 α + 1.875 n β. Tree: 8 α + 8 n β. The ring wins when 22 α < 6.125 n β, i.e.
# n > 22 · 10 µs · 10 GB/s / 6.125 ≈ 359 kB. The cell below checks 300 kB and 400 kB.
# </details>

# %%
alpha, bandwidth = 10e-6, 10e9
crossover = 22 * alpha * bandwidth / 6.125
print(f"crossover ~ {crossover / 1e3:.0f} kB")
t = {(alg, n): simulate_collective(alg, workers=16, nbytes=n, latency=alpha, bandwidth=bandwidth).time
     for alg in ("ring", "tree") for n in (300e3, 400e3)}
print({k: f"{v * 1e6:.1f} us" for k, v in t.items()})
assert t["tree", 300e3] < t["ring", 300e3] and t["ring", 400e3] < t["tree", 400e3]
assert abs(crossover - 359e3) < 1e3

# %% [markdown]
# **Exercise 2.** A parameter server with N = 32 workers and 100 MB gradients over 10 GB/s: how long does one
# all-reduce take, and how much faster is the ring?
#
# <details><summary>Answer</summary>
#
# PS: 2N (α + n β) = 64 · (10 µs + 10 ms) ≈ 0.64 s. Ring: 62 · 10 µs + 2·31/32 · 10 ms = 0.62 ms + 19.4 ms ≈ 20 ms,
# about 32 times faster: the server's port is the bottleneck.
# </details>

# %%
ps = big[(big.algorithm == "ps") & (big.workers == 32)].time.item()
ring = big[(big.algorithm == "ring") & (big.workers == 32)].time.item()
print(f"ps {ps:.3f} s, ring {ring * 1e3:.1f} ms, ratio {ps / ring:.1f}")
assert abs(ps - 64 * (10e-6 + 100e6 / 10e9)) < 1e-9
assert abs(ring - (62 * 10e-6 + 2 * 31 / 32 * 100e6 / 10e9)) < 1e-9
assert 30 < ps / ring < 33
