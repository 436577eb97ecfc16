# %% [markdown]
# # 4. PipeDream: 1F1B without a flush
#
# GPipe and 1F1B stop at the end of every iteration: the pipeline drains, every stage updates, and the next
# iteration fills the pipeline again. That flush costs the bubble (K-1)/(M+K-1) *every* iteration.
#
# PipeDream (Narayanan et al., *PipeDream: Generalized Pipeline Parallelism for DNN Training*, SOSP 2019) never
# flushes. Micro-batches keep flowing in 1F1B order, and each stage updates its weights right after every
# backward. This notebook measures what that buys (throughput), and what it costs: several **weight versions**
# per stage (weight stashing) and **stale** weights.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import pandas as pd

import sim
from sim.io.plots import gantt
from sim.results.timeline import compute_rows

K, M, N = 4, 4, 4          # devices, micro-batches per iteration, iterations
F, B = 1.0, 2.0
costs = sim.uniform(K, forward=F, backward=B)

# %% [markdown]
# ## No flush: the bubble is paid once
#
# Two iterations side by side: 1F1B with a flush, and PipeDream.

# %%
two = [sim.simulate(sim.schedules.generate(name, K, M, iterations=2), costs) for name in ("1f1b", "pipedream")]
gantt(two, titles=["1F1B with flush", "PipeDream"])

# %% [markdown]
# The dashed lines mark where each device starts its next iteration: 1F1B starts it only after its flush,
# PipeDream's devices go straight on. The black ticks are the updates (they take no time here): PipeDream updates
# after every backward, and each of its boxes names the weight version its micro-batch uses, `w0`, `w1`, ...
# (w1: after one update). A backward uses its forward's version, not the newest one: weight stashing, below.
#
# The flush schedule repeats its fill and drain each iteration; PipeDream has one fill at the start and one drain
# at the end. Over N iterations (uniform stages, free links):
#
# $$ T_\text{flush} = N (M + K - 1)(F + B), \qquad T_\text{PipeDream} = (N M + K - 1)(F + B) $$
#
# so PipeDream's utilization N M / (N M + K - 1) tends to 1 as training goes on.

# %%
flush = sim.simulate(sim.schedules.one_f_one_b(K, M, iterations=N), costs)
pd_run = sim.simulate(sim.schedules.pipedream(K, M, iterations=N), costs)
print(f"1F1B flush: makespan {flush.metrics.makespan:g}, utilization {flush.metrics.utilization:.1%}")
print(f"PipeDream:  makespan {pd_run.metrics.makespan:g}, utilization {pd_run.metrics.utilization:.1%}")
assert flush.metrics.makespan == N * (M + K - 1) * (F + B)          # 84
assert pd_run.metrics.makespan == (N * M + K - 1) * (F + B)         # 57
assert abs(pd_run.metrics.utilization - N * M / (N * M + K - 1)) < 1e-9   # 16/19 = 84.2%

# %% [markdown]
# ## Weight stashing
#
# With an update after every backward, the weights of stage 0 change while micro-batches are still in flight.
# Micro-batch m's backward must use the *same* weights as its forward, or its gradient is wrong (notebook 2: the
# backward needs what its forward saw). PipeDream therefore keeps ("stashes") the weight version each forward used
# until that micro-batch's backward is done (section 3.3 of the paper). Stage s has up to K-s micro-batches in
# flight, each possibly on a different version, so it holds up to **K-s weight versions**:

# %%
print("weight versions held at most, per stage: PipeDream", pd_run.metrics.weight_versions,
      "  1F1B flush", flush.metrics.weight_versions)
assert pd_run.metrics.weight_versions == [K - s for s in range(K)]
assert flush.metrics.weight_versions == [1] * K

# %% [markdown]
# For a big model this is a lot: stage 0 stores K copies of its weights. It is the reason PipeDream's memory
# grows with the pipeline depth even though its activations (like 1F1B's) do not grow with M.
#
# ## Staleness
#
# Which version does a forward read? Count the updates of its stage that finished before it started. The
# micro-batch index minus that count is the number of earlier micro-batches whose update it did not see: its
# **staleness**. We read it off the simulated timeline.

# %%
tl = compute_rows(pd_run.timeline)
rows = {}
for s in range(K):
    updates = tl[(tl.op == "U") & (tl.stage == s)]["end"].to_numpy()
    fwd = tl[(tl.op == "F") & (tl.stage == s)].sort_values("microbatch")
    rows[f"stage {s}"] = [int(m - (updates <= t).sum()) for m, t in zip(fwd.microbatch, fwd.start)]
staleness = pd.DataFrame(rows, index=pd.Index(range(N * M), name="micro-batch")).T
print("updates missed by each forward (staleness):")
print(staleness.iloc[:, :10].to_string())
for s in range(K):
    steady = staleness.loc[f"stage {s}"].iloc[K:]
    assert (steady == K - s - 1).all()          # stage s runs K-s-1 updates behind

# %% [markdown]
# In the steady state stage s computes with weights that are K-s-1 updates old, and **different stages use
# different versions for the same micro-batch**: stage 0 is 3 updates behind, stage 3 is up to date. The
# gradient is then not the gradient of any single model, unlike GPipe and 1F1B, whose result equals
# one-device training with gradient accumulation. PipeDream reports that training still converges, but the
# semantics differ from synchronous SGD.
#
# ## PipeDream-2BW: two versions are enough
#
# PipeDream-2BW (Narayanan et al., *Memory-Efficient Pipeline-Parallel DNN Training*, ICML 2021) changes two
# things: gradients are accumulated over M micro-batches and the weights are updated once per M (like GPipe, but
# without a flush), and only two weight buffers are kept ("double-buffered weights"). With M ≥ K, every micro-batch
# in flight uses either the current or the previous version, and the update is
#
# $$ W^{(t+1)} = W^{(t)} - \nu \, \nabla f\big(W^{(t-1)}\big), $$
#
# a constant delay of one update on every stage (section 3.1 of the 2BW paper). Memory: 2 versions instead of
# K-s; throughput: still no flush. The simulator has it as `pipedream-2bw`:

# %%
bw2 = sim.simulate(sim.schedules.generate("pipedream-2bw", K, M, iterations=N), costs)
tl2 = compute_rows(bw2.timeline)
version_read = {}
for s in range(K):
    updates = tl2[(tl2.op == "U") & (tl2.stage == s)]["end"].to_numpy()
    fwd = tl2[(tl2.op == "F") & (tl2.stage == s)].sort_values("microbatch")
    version_read[f"stage {s}"] = [int((updates <= t).sum()) for t in fwd.start]
versions = pd.DataFrame(version_read, index=pd.Index(range(N * M), name="micro-batch")).T
print(f"makespan {bw2.metrics.makespan:g} (PipeDream {pd_run.metrics.makespan:g}), "
      f"weight versions per stage {bw2.metrics.weight_versions}")
print("weight version read by each forward:")
print(versions.to_string())
assert bw2.metrics.makespan == pd_run.metrics.makespan           # same throughput as PipeDream
assert max(bw2.metrics.weight_versions) == 2                      # double buffering
for s in range(K):                                                # batch t reads version t-1, on every stage
    assert versions.loc[f"stage {s}"].tolist() == [max(m // M - 1, 0) for m in range(N * M)]

# %% [markdown]
# Every stage now reads the *same* version for a given micro-batch (batch t uses version t-1), so the gradient of a
# batch is the gradient of one model, just one step old. That is what makes 2BW's delayed update easy to analyse,
# and it needs two weight buffers, not K.
#
# ## Exercises
#
# **Exercise 1.** K = 8 stages with 2 GiB of weights each. How many bytes of weights does stage 0 hold at most
# under PipeDream, and under 1F1B with a flush?
#
# <details><summary>Answer</summary>
#
# PipeDream: K = 8 versions, 8 · 2 = 16 GiB. 1F1B: one version, 2 GiB. (Notebook 3's gradients and activations
# come on top.) The simulation below needs enough micro-batches in flight (N·M ≥ K) to reach the steady state.
# </details>

# %%
GiB = 2**30
c8 = sim.uniform(8, weight_bytes=2 * GiB)
p8 = sim.simulate(sim.schedules.pipedream(8, 8, iterations=2), c8)
f8 = sim.simulate(sim.schedules.one_f_one_b(8, 8, iterations=2), c8)
print("PipeDream stage 0:", p8.metrics.peak_memory[0] / GiB, "GiB;  1F1B:", f8.metrics.peak_memory[0] / GiB, "GiB")
assert p8.metrics.weight_versions[0] == 8 and p8.metrics.peak_memory[0] == 16 * GiB
assert f8.metrics.peak_memory[0] == 2 * GiB

# %% [markdown]
# **Exercise 2.** K = 4, M = 4. How many iterations does PipeDream need before its utilization passes 95%?
#
# <details><summary>Answer</summary>
#
# 4N / (4N + 3) ≥ 0.95 gives 4N ≥ 57, N ≥ 14.25, so N = 15 (60/63 ≈ 95.2%; N = 14 gives 56/59 ≈ 94.9%).
# The plot shows utilization against N for both schedules: the flush schedule stays at 4/7.
# </details>

# %%
ns = list(range(1, 21))
u_pd = [sim.simulate(sim.schedules.pipedream(K, M, iterations=n), costs).metrics.utilization for n in ns]
u_fl = [sim.simulate(sim.schedules.one_f_one_b(K, M, iterations=n), costs).metrics.utilization for n in ns]
first = next(n for n, u in zip(ns, u_pd) if u > 0.95)
assert first == 15 and all(abs(u - 4 / 7) < 1e-9 for u in u_fl)
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(ns, u_pd, "o-", label="PipeDream (no flush)")
ax.plot(ns, u_fl, "s-", label="1F1B with flush")
ax.axhline(0.95, color="grey", ls=":")
ax.set_xlabel("iterations N")
ax.set_ylabel("utilization (simulated)")
ax.set_title(f"K={K}, M={M}: PipeDream passes 95% at N = {first}")
ax.legend()
plt.show()
