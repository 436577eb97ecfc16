# %% [markdown]
# # 1. Naive model parallelism vs GPipe
#
# A model too big for one device is cut into **K stages**, one per device. Device 0 holds the first layers,
# device K-1 the last. A batch must go forward through all devices, then backward through all of them again.
#
# This notebook redraws the lecture's picture with the simulator, measures the utilization of both ways of
# running it (25% vs 57% for K = 4 devices and M = 4 micro-batches), and derives the formula for the idle time,
# the **bubble**.
#
# Throughout: a forward of one micro-batch on one stage takes F = 1 s and its backward B = 2 s (a backward costs
# about twice a forward: it computes a gradient for the inputs *and* one for the weights; only the ratios matter,
# the simulator takes any unit and the charts call it seconds). Links between devices are free (no transfer time),
# and the weight update takes no time, as in the paper's figures.

# %% [markdown]
# **Play with it first.** `pipesim page playground -o playground.html` writes one HTML file that runs offline in
# any browser (no server, no install): pick a schedule, the devices K, the micro-batches M and the costs, and the
# Gantt chart, the memory per device and the bubble redraw as you move the controls; a second schedule can be laid
# under the first on the same time axis. Its numbers are the simulator's own (README, "Interactive pages"). Open it
# beside this notebook: set K = 4, M = 4, "naive" against "gpipe", and you have the two pictures below.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

import sim
from sim.io.plots import gantt

K, M = 4, 4            # devices, micro-batches
F, B = 1.0, 2.0        # time of one forward / one backward of one micro-batch on one stage
costs = sim.uniform(K, forward=F, backward=B)

# %% [markdown]
# ## Naive model parallelism
#
# The simplest way: one micro-batch travels forward through the devices, comes back through the backward,
# and only then does the next one enter. While device 0 computes, devices 1, 2 and 3 wait; and so on.

# %%
naive = sim.simulate(sim.schedules.naive(K, M), costs)
gantt(naive, titles=["naive model parallelism"])

# %% [markdown]
# Only one device works at any moment, so each device is busy 1/K of the time:

# %%
util_naive = naive.metrics.utilization
print(f"naive: makespan {naive.metrics.makespan:g}, utilization {util_naive:.1%}")
assert abs(util_naive - 1 / K) < 1e-9                       # 25% at K = 4
assert naive.metrics.makespan == M * K * (F + B)            # 48: every action runs alone

# %% [markdown]
# ## GPipe: pipeline the micro-batches
#
# GPipe (Huang et al., *GPipe*, NeurIPS 2019) splits the mini-batch into M micro-batches and lets them follow
# each other through the pipeline: as soon as device 0 has finished the forward of micro-batch 0, it starts
# micro-batch 1 while device 1 works on micro-batch 0. After all forwards come all backwards, then every device
# applies its accumulated gradient (the update `U`: the black tick at the end of each row, drawn as a tick because
# it takes no time here) and the pipeline is empty again: a **flush**.

# %%
gpipe = sim.simulate(sim.schedules.gpipe(K, M), costs)
gantt([naive, gpipe], titles=["naive", "GPipe"])

# %%
util_gpipe = gpipe.metrics.utilization
print(f"GPipe: makespan {gpipe.metrics.makespan:g}, utilization {util_gpipe:.1%}")
assert abs(util_gpipe - 4 / 7) < 1e-9                       # 57% at K = M = 4
assert gpipe.metrics.makespan == 21                         # seconds, instead of 48
updates = gpipe.timeline[gpipe.timeline["op"] == "U"]
assert len(updates) == K and (updates["end"] == updates["start"]).all()   # one U per device, taking no time

# %% [markdown]
# Same work, same devices: 21 s instead of 48 s, because devices now work at the same time on
# different micro-batches.
#
# ## Where the bubble comes from
#
# Look at device K-1 (the bottom row). Its first forward can start only after the K-1 devices above have
# each run one forward: it idles for (K-1)·F at the start (the **fill**), and after its last backward it idles
# while the gradients travel back up through K-1 backwards, (K-1)·B (the **drain**). Device 0 (the top row) has
# the mirror image: it starts at once, but waits (K-1)·F for the last forward to reach the bottom and (K-1)·B for
# the first gradient to come back. Every device, whatever its place, waits (K-1)·(F+B) in total; only *when* it
# waits differs.
#
# Each device computes M·(F+B). So the makespan and the idle share (the *bubble fraction*) are
#
# $$ T = (M + K - 1)(F + B), \qquad \text{bubble} = \frac{K-1}{M+K-1} $$
#
# (GPipe paper, section 2.3). Megatron-LM's papers use the ratio of idle time to useful time instead,
# $(K-1)/M$ (Narayanan et al., SC'21, section 2.2); both say the same thing.
#
# The simulator knows nothing about this formula: it only places each action as early as its inputs and its
# device allow. Let's check the formula against it for several M.

# %%
print(" M   simulated bubble   (K-1)/(M+K-1)   idle/busy   (K-1)/M")
for m in [1, 2, 4, 8, 16, 32]:
    r = sim.simulate(sim.schedules.gpipe(K, m), costs)
    formula = (K - 1) / (m + K - 1)
    print(f"{m:2d}   {r.metrics.bubble_fraction:16.4f}   {formula:13.4f}   {r.metrics.bubble_ratio:9.4f}   {(K - 1) / m:7.4f}")
    assert abs(r.metrics.bubble_fraction - formula) < 1e-9
    assert abs(r.metrics.bubble_ratio - (K - 1) / m) < 1e-9
    assert r.metrics.makespan == (m + K - 1) * (F + B)

# %% [markdown]
# ## Why M ≥ 4K makes the bubble small
#
# The bubble depends only on the ratio M/K. The fill and drain cost K-1 slots whatever M is; more micro-batches
# spread that fixed cost over more useful work. At M = 4K the bubble is (K-1)/(5K-1), below 20% for every K,
# and the GPipe authors report that with M ≥ 4K the bubble overhead becomes negligible in their experiments
# (part of the idle time is filled by re-computation; notebook 3). The plot: bubble against M/K for a few K.

# %%
fig, ax = plt.subplots(figsize=(7, 3.6))
for k in [2, 4, 8]:
    ratios = [1, 2, 4, 8, 16]
    bubbles = [sim.simulate(sim.schedules.gpipe(k, r * k), sim.uniform(k)).metrics.bubble_fraction for r in ratios]
    ax.plot(ratios, bubbles, "o-", label=f"K = {k}")
    at_4k = bubbles[ratios.index(4)]
    assert abs(at_4k - (k - 1) / (5 * k - 1)) < 1e-9 and at_4k < 0.2
ax.axvline(4, color="grey", ls=":")
ax.text(4.2, 0.3, "M = 4K", color="grey")
ax.set_xscale("log", base=2)
ax.set_xticks(ratios, [str(r) for r in ratios])
ax.set_xlabel("micro-batches per device, M / K")
ax.set_ylabel("bubble fraction (simulated)")
ax.set_title("GPipe: the bubble falls as M/K grows")
ax.legend()
plt.show()

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** K = 8 devices, M = 8 micro-batches, F = 1, B = 2. What utilization does GPipe reach, and what
# would naive model parallelism reach?
#
# <details><summary>Answer</summary>
#
# GPipe: M/(M+K-1) = 8/15 ≈ 53.3%. Naive: 1/K = 1/8 = 12.5%, whatever M is. The next cell checks both.
# </details>

# %%
r8 = sim.simulate(sim.schedules.gpipe(8, 8), sim.uniform(8))
n8 = sim.simulate(sim.schedules.naive(8, 8), sim.uniform(8))
print(f"GPipe {r8.metrics.utilization:.1%}, naive {n8.metrics.utilization:.1%}")
assert abs(r8.metrics.utilization - 8 / 15) < 1e-9 and abs(n8.metrics.utilization - 1 / 8) < 1e-9

# %% [markdown]
# **Exercise 2.** With K = 4, how many micro-batches does GPipe need for the bubble to be at most 10%?
#
# <details><summary>Answer</summary>
#
# (K-1)/(M+K-1) ≤ 0.1 gives M + 3 ≥ 30, so M ≥ 27: at M = 27 the bubble is 3/30 = 10% exactly, at M = 26 it is
# 3/29 ≈ 10.3%.
# </details>

# %%
b27 = sim.simulate(sim.schedules.gpipe(4, 27), costs).metrics.bubble_fraction
b26 = sim.simulate(sim.schedules.gpipe(4, 26), costs).metrics.bubble_fraction
print(f"M=26: {b26:.2%}   M=27: {b27:.2%}")
assert b26 > 0.1 and abs(b27 - 0.1) < 1e-9

# %% [markdown]
# **Exercise 3.** Does the ratio B/F change GPipe's bubble fraction? Try F = 1, B = 3.
#
# <details><summary>Answer</summary>
#
# No, as long as all stages are equal: fill and drain cost (K-1)(F+B) per device and the useful work M(F+B),
# so F+B cancels. The makespan changes (28 instead of 21 at K = M = 4), the fraction stays 3/7.
# </details>

# %%
r = sim.simulate(sim.schedules.gpipe(K, M), sim.uniform(K, forward=1, backward=3))
print(f"makespan {r.metrics.makespan:g}, bubble {r.metrics.bubble_fraction:.4f}")
assert r.metrics.makespan == 28 and abs(r.metrics.bubble_fraction - 3 / 7) < 1e-9
