# %% [markdown]
# # 11. Beyond hand-written schedules: let the search find them
#
# Every schedule so far was written by hand: GPipe, 1F1B, ZB-H1, ZB-H2, ZB-V. The zero-bubble paper (Qi et al.,
# ICLR 2024, section 3) goes one step further: give a scheduler the measured F, B and W times, the link time and a
# memory limit, and let it find the order. `sim.synthesize` does that:
#
# 1. a **greedy list scheduler** with the paper's heuristic (forwards as far as memory allows before the first
#    backward, backwards first when they are ready, W passes into the gaps and whenever memory runs out), run with
#    a small family of policies;
# 2. a **local search** (move W passes, swap neighbours) where every candidate is timed by the exact engine;
# 3. for small problems an **exact ILP** (PuLP + CBC, `pip install 'pipesim[synth]'`).
#
# Every result is validated (every action once, no deadlock) and its memory, per the memory model, stays under the
# cap on every device. The output also gives a **lower bound**: the busiest device's work plus the time before it
# can start (and, without enough W work to hide it, the backward chain after its last B). No schedule beats it.
#
# We start where the paper starts: K = 4 devices, M = 8 micro-batches, F = B = W = 1 per stage.

# %%
# %matplotlib inline
import sim
from sim.io.plots import gantt
from sim.search.synthesis_compare import best_fitting, compare_registered, gain

K, M = 4, 8
costs = sim.uniform(K, forward=1.0, backward=1.0, weight=1.0)
hardware = sim.Hardware(devices=K)


def handwritten(name):
    return sim.simulate(sim.schedules.generate(name, K, M), costs, hardware)


# %% [markdown]
# ## Under 1F1B's memory, the search finds ZB-H1
#
# `memory_limit=K` allows K micro-batches of activations per device: what 1F1B holds on its first device, the
# zero-bubble paper's M_limit for ZB-1p. `seeds=False` keeps the hand-written schedules out of the search: the
# greedy scheduler alone has to find the shape.

# %%
one = sim.synthesize(costs, hardware, microbatches=M, memory_limit=K, method="greedy", seeds=False)
zb_h1 = handwritten("zb-h1")
print(f"synthesized {one.makespan:g}   ZB-H1 {zb_h1.metrics.makespan:g}   1F1B-memory bound {one.bound:g}")
print(one.schedule.to_text())
print("in flight per device:", one.result.metrics.peak_inflight)
assert one.makespan == zb_h1.metrics.makespan == one.bound
assert max(one.result.metrics.peak_inflight) <= K

# %% [markdown]
# The same makespan as ZB-H1, (K-1)(F+B-W) + 3M = 27, which is also the bound: device 3 cannot start before the
# forwards of micro-batch 0 reach it (3 units) and then has 3M = 24 units of work. The orders are not ZB-H1's
# letter for letter (device 1 runs a fourth forward where ZB-H1 waits), but the shape is the same: a warm-up of
# forwards as far as the cap allows, then F, B and a postponed W in turn, the postponed W passes filling the
# cool-down.
#
# ## Under twice that memory, it finds ZB-H2

# %%
two = sim.synthesize(costs, hardware, microbatches=M, memory_limit=2 * K, method="greedy", seeds=False)
zb_h2 = handwritten("zb-h2")
print(f"synthesized {two.makespan:g}   ZB-H2 {zb_h2.metrics.makespan:g}   bound {two.bound:g}")
print("bubble rate (the paper's):", two.result.metrics.bubble_rate_zb, "  in flight:", two.result.metrics.peak_inflight)
assert two.makespan == zb_h2.metrics.makespan and two.result.metrics.bubble_rate_zb < 1e-9

# %%
gantt([one.result, zb_h1, two.result, zb_h2],
      titles=["synthesized, 1F1B's memory", "ZB-H1", "synthesized, twice 1F1B's memory", "ZB-H2"])

# %% [markdown]
# ## What W keeps decides how close to zero the bubble gets
#
# Up to here the memory model keeps a micro-batch's activations until its W ends. The zero-bubble paper counts
# less (section 2.1): B frees most of them, W only needs M_W of the M_B that F allocated (the layer inputs and
# output gradients; its runtime uses M_B = 34h + 5as and M_W = 32h bytes per token, so W keeps 37% for its 1.5B
# model). Under a 2K cap that lets a device postpone many more W passes, which is how ZB-2p gets "almost zero
# bubble". `weight_memory=` (or a costs column `weight_activation_bytes`) switches it on. Below: the paper's 1.5B
# setting (its table 9 times, as recalled in `benchmarks/bench_synthesis.py`), K = 8, M = 32, twice 1F1B's memory,
# the greedy scheduler alone.

# %%
K8, M32 = 8, 32
t9 = sim.uniform(K8, forward=18.5, backward=18.1, weight=9.3, activation_bytes=1.0)  # one M_B per micro-batch
links = sim.Hardware(devices=K8, latency=0.6)
keep_all = sim.synthesize(t9, links, microbatches=M32, memory_limit=2 * K8, method="greedy", seeds=False)
paper = sim.synthesize(t9, links, microbatches=M32, memory_limit=2 * K8, method="greedy", seeds=False,
                       weight_memory=0.37)
for label, found in (("W keeps everything", keep_all), ("W keeps M_W = 0.37 M_B", paper)):
    print(f"{label:<24} makespan {found.makespan:7.1f} ms   bubble rate {found.result.metrics.bubble_rate_zb:6.2%}")
assert paper.result.metrics.bubble_rate_zb < 0.01 < keep_all.result.metrics.bubble_rate_zb

# %% [markdown]
# The makespan is the same (both meet the bound), but with the paper's memory model every device's span shrinks to
# its own work: the last device postpones all its W passes (they cost 0.37 each, not 1), so the backwards reach
# device 0 early, and the bubble rate falls under 1%.

# %% [markdown]
# With 2K micro-batches allowed, the first device keeps forwarding through the whole warm-up, and no device idles
# between its first and its last action: zero bubble in the paper's sense (its section 5.1 measures the bubble
# inside each device's span).
#
# ## Uneven stages and a hard cap: no hand-written schedule fits
#
# Real pipelines are rarely even: the first stage carries the embedding, the last the output layer and the loss
# (torchtitan #2093). Say the first stage costs 1.5x the others and the last 2x, with activations in proportion,
# and the devices have room for 1.5 K units of activations: more than 1F1B needs on its first device, less than
# ZB-H1 or ZB-V keep on the heavy last one.

# %%
K2, M2 = 6, 12
scale = [1.5] + [1.0] * (K2 - 2) + [2.0]
uneven = sim.StageCosts(forward=scale, backward=scale, weight=scale, activation_bytes=scale, send_bytes=1.0)
links = sim.Hardware(devices=K2, latency=0.02)
found = sim.synthesize(uneven, links, microbatches=M2, memory_bytes=1.5 * K2, placement="any", method="local",
                       seconds=5)
rivals = compare_registered(found, uneven, links)
for r in rivals:
    print(f"{r.name:<17} {r.makespan:7.2f}  peak {max(r.peak):5.2f}  {'fits' if r.fits else 'over the cap'}")
best = best_fitting(rivals)
print(f"\nsynthesized      {found.makespan:7.2f}  peak {max(found.peak):5.2f}  "
      f"({found.problem.stages // K2} stages per device, bound {found.bound:.2f})")
print(gain(found, best).line())
assert found.makespan < best.makespan and all(not r.fits for r in rivals if r.name.startswith("zb"))

# %%
gantt([found.result, best.result], titles=["synthesized", f"{best.name}, the best registered schedule that fits"],
      memory=True)

# %% [markdown]
# The search keeps each device under the cap (the memory panel's top line) and still gets close to its bound: on
# the V placement (`placement="any"` tries a line and a V and keeps the faster) the heavy last stage shares a device
# with the second stage, so its work starts early, and the W passes fill the cool-down. The hand-written schedules
# that fit this cap are the memory-frugal ones (1F1B and naive model parallelism), with their full bubble.
#
# Everything the search returns is a `Schedule` like any other: `sim.simulate` it, draw it, export it with
# `pipesim synthesize ... -o mine.csv` (PyTorch's schedule CSV) and run it with the validator.

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** With F = B = W = 1, K = 4 and M = 8, derive the lower bound the search prints, and explain why
# ZB-H1 reaches it although it idles (K-1)(F+B-W) = 3 units per device.
#
# <details><summary>Answer</summary>
#
# Device 3 cannot start before micro-batch 0's forwards on devices 0..2 are done: 3 units. Then it has M(F+B+W) = 24
# units of its own work: 27. ZB-H1's makespan is 27 too: the idle time of devices 0..2 lies outside the critical
# device's span (device 0 waits in its warm-up, device 3 before its first forward), so it does not lengthen the
# run; only the memory cap keeps ZB-H1's devices from working through it.
# </details>

# %%
assert one.bound == (K - 1) * 1.0 + M * 3.0

# %% [markdown]
# **Exercise 2.** Lower the cap to K - 1 = 3 micro-batches. Will the search still reach 27? Check, and name the
# device that loses time.
#
# <details><summary>Answer</summary>
#
# No: with three micro-batches in flight, device 0 runs out of memory before the first backward comes back (it
# needs K forwards to cover the round trip), so it waits, and the forwards it could not start delay every device
# below it. The search finds the best order it can under that cap; the bound ignores memory, so the gap it prints
# is an upper bound on how far from optimal the result is.
# </details>

# %%
tight = sim.synthesize(costs, hardware, microbatches=M, memory_limit=K - 1, method="local", seconds=3)
print(f"cap {K - 1}: makespan {tight.makespan:g}, bound {tight.bound:g}, gap {tight.gap:.1%}")
assert tight.makespan > one.makespan and max(tight.result.metrics.peak_inflight) <= K - 1
