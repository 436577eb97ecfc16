# %% [markdown]
# # 3. Memory vs time
#
# Notebook 2 showed that GPipe keeps the activations of all M micro-batches on every device. More micro-batches
# shrink the bubble (notebook 1) but grow this memory. Two ways out:
#
# - **re-materialization** (activation checkpointing): keep only each stage's *input* per micro-batch and
#   recompute the forward just before the backward. Less memory, more time.
# - **1F1B** scheduling: start backwards early, so fewer micro-batches are in flight at once. Less memory,
#   same time.
#
# We measure both on K = 4 devices against a memory **capacity line**.

# %%
# %matplotlib inline
import sim
from sim.io.plots import gantt, memory_plot

GiB = 2**30
K, M = 4, 8
F, B, R = 1.0, 2.0, 1.0     # recompute R re-runs the forward: same cost as F
w = g = 1 * GiB             # weights and gradient buffer per stage
a = 2 * GiB                 # activations kept per micro-batch per stage between its F and its B
c = 0.25 * GiB              # what re-materialization keeps instead: the stage input
costs = sim.uniform(K, forward=F, backward=B, recompute=R, weight_bytes=w, grad_bytes=g,
                    activation_bytes=a, checkpoint_bytes=c)

# %% [markdown]
# ## Re-materialization in GPipe
#
# GPipe (Huang et al. 2019, section 2.3) stores only the activations at the stage boundaries during the forward,
# and re-runs each stage's forward (`R`) right before its backward. The idea is Chen et al., *Training Deep Nets
# with Sublinear Memory Cost* (2016). Peak memory per device:
#
# $$ \text{without: } w + g + M a \qquad\qquad \text{with: } w + g + M c + a $$
#
# (the stage inputs of all M micro-batches, plus the full activations of the one micro-batch being recomputed).

# %%
plain = sim.simulate(sim.schedules.gpipe(K, M), costs)
remat = sim.simulate(sim.schedules.gpipe(K, M, recompute=True), costs)
for name, r in [("GPipe", plain), ("GPipe + recompute", remat)]:
    print(f"{name:18s} makespan {r.metrics.makespan:4g}   peak per device {max(r.metrics.peak_memory) / GiB:g} GiB")
assert all(p == w + g + M * a for p in plain.metrics.peak_memory)              # 18 GiB
assert all(p == w + g + M * c + a for p in remat.metrics.peak_memory)          # 6 GiB
assert remat.metrics.makespan == plain.metrics.makespan + M * R                # 33 -> 41

# %%
gantt([plain, remat], titles=["GPipe", "GPipe with re-materialization"], memory=True)

# %% [markdown]
# The price is time: every micro-batch runs its forward twice. Here the last device recomputes each micro-batch
# just before its backward, on the critical path, so the iteration grows by M·R = 8 units, from 33 to 41.
# Memory dropped from 18 to 6 GiB per device.
#
# ## 1F1B: fewer micro-batches in flight
#
# 1F1B (PipeDream-Flush, Narayanan et al. 2021; DAPPLE, Fan et al. 2021) lets stage s run only K-s-1 forwards
# before its first backward, then alternates one forward and one backward. A micro-batch's activations are freed
# as soon as its backward is done, so stage s never holds more than min(K-s, M) micro-batches, instead of M.
# The bubble is unchanged: it is the same fill and drain.

# %%
ofob = sim.simulate(sim.schedules.one_f_one_b(K, M), costs)
print("in flight at most, per device:  GPipe", plain.metrics.peak_inflight, "  1F1B", ofob.metrics.peak_inflight)
print("peak GiB per device:            GPipe", [p / GiB for p in plain.metrics.peak_memory],
      "  1F1B", [p / GiB for p in ofob.metrics.peak_memory])
print("makespan:                       GPipe", plain.metrics.makespan, "  1F1B", ofob.metrics.makespan)
assert plain.metrics.peak_inflight == [M] * K
assert ofob.metrics.peak_inflight == [min(K - s, M) for s in range(K)]       # [4, 3, 2, 1]
assert ofob.metrics.makespan == plain.metrics.makespan

# %%
gantt([plain, ofob], titles=["GPipe", "1F1B"], memory=True)

# %% [markdown]
# Note the staircase: device 0 holds the most (it starts K-1 micro-batches before the first gradient comes
# back), device K-1 the least. This is why "the first stage uses more memory" in 1F1B pipelines.
#
# ## The capacity line
#
# Give every device 12 GiB. The simulator marks any device that would go over.

# %%
hw = sim.Hardware(devices=K, memory_capacity=12 * GiB)
runs = {name: sim.simulate(sim.schedules.generate(sched, K, M, recompute=rc), costs, hw)
        for name, sched, rc in [("GPipe", "gpipe", False), ("GPipe + recompute", "gpipe", True), ("1F1B", "1f1b", False)]}
for name, r in runs.items():
    print(f"{name:18s} peak {max(r.metrics.peak_memory) / GiB:4g} GiB  makespan {r.metrics.makespan:g}  "
          f"{'OVER capacity on ' + str(len(r.memory.overflows)) + ' devices' if r.memory.overflows else 'fits'}")
assert len(runs["GPipe"].memory.overflows) == K
assert not runs["GPipe + recompute"].memory.overflows and not runs["1F1B"].memory.overflows
memory_plot(runs["GPipe"])

# %% [markdown]
# GPipe with M = 8 does not fit; re-materialization fits at the cost of 24% more time (41 vs 33); 1F1B fits at no
# cost in time. Since 1F1B's memory does not depend on M, it can also use a larger M to shrink the bubble, which
# GPipe cannot without recompute.
#
# ## Exercises
#
# **Exercise 1.** With these costs and 12 GiB per device, what is the largest M that plain GPipe can run? And
# GPipe with re-materialization?
#
# <details><summary>Answer</summary>
#
# Plain: 2 + 2M ≤ 12, so M ≤ 5. With recompute: 2 + 0.25 M + 2 ≤ 12, so M ≤ 32.
# </details>

# %%
def largest_fitting_m(recompute):
    ok = [m for m in range(1, 37)
          if not sim.simulate(sim.schedules.gpipe(K, m, recompute=recompute), costs, hw).memory.overflows]
    return max(ok)


plain_max, remat_max = largest_fitting_m(False), largest_fitting_m(True)
print("plain:", plain_max, " with recompute:", remat_max)
assert plain_max == 5 and remat_max == 32

# %% [markdown]
# **Exercise 2.** 1F1B with M = 8: which device has the highest peak, how much, and does it change at M = 32?
#
# <details><summary>Answer</summary>
#
# Device 0: w + g + K·a = 2 + 4·2 = 10 GiB. It does not change with M once M ≥ K, because at most K micro-batches
# are ever in flight on device 0.
# </details>

# %%
for m in (8, 32):
    peaks = sim.simulate(sim.schedules.one_f_one_b(K, m), costs).metrics.peak_memory
    print(m, [p / GiB for p in peaks])
    assert max(peaks) == peaks[0] == w + g + K * a
