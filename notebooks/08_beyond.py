# %% [markdown]
# # 8. Beyond 1F1B: interleaving, zero bubble, DualPipe
#
# 1F1B fixed GPipe's memory, but not its bubble: (K-1)/(M+K-1) of the time is still idle. Three newer ideas
# shrink the bubble further, each at a price:
#
# 1. **interleaved 1F1B** (Megatron-LM's virtual pipeline): several smaller model chunks per device;
# 2. **zero bubble** (ZB-H1, ZB-H2): split the backward into its input-gradient part B and its weight-gradient part
#    W, and move the W passes into the holes;
# 3. **V-shaped schedules** (ZB-V, DualPipeV): two chunks per device placed in a V, so the last stage sits next to
#    the first.
#
# We run them all on the same model: K = 4 devices, M = 8 micro-batches, and per device a forward F = 1, an
# input-gradient backward B = 1 and a weight-gradient backward W = 1 (schedules that do not split the backward run
# B and W together, 2 units). Schedules with v chunks per device cut each device's share into v chunks of 1/v the
# cost.

# %%
# %matplotlib inline
import pandas as pd

import sim
from sim.io.plots import gantt

K, M = 4, 8
F, B, W = 1.0, 1.0, 1.0


def run(name, *, chunks=1, latency=0.0, m=M, weight=W, backward=B, iterations=1):
    schedule = sim.schedules.generate(name, K, m, chunks=chunks, iterations=iterations)
    costs = sim.uniform(K, forward=F, backward=backward, weight=weight, activation_bytes=1.0, send_bytes=1.0)
    if schedule.stages > K:
        costs = costs.split_into_chunks(schedule.stages // K)     # each chunk: 1/v of the device's share
    return sim.simulate(schedule, costs, sim.Hardware(devices=K, latency=latency))


SCHEDULES = [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-h2", 1), ("zbv", 2), ("dualpipev", 2)]
results = {name: run(name, chunks=v) for name, v in SCHEDULES}

# %%
gantt([results[n] for n in ("1f1b", "interleaved-1f1b", "zb-h1", "zbv")])

# %% [markdown]
# A device's first chunk is drawn in full colour and its second in a lighter shade: in interleaved 1F1B device d
# holds stages d and d+K; in ZB-V it holds stages d and 2K-1-d, so the forwards run down the dark chunks and back up
# the light ones (the V), and the backwards return the same way.

# %% [markdown]
# ## The bubble, measured and predicted
#
# "Idle per device" is K × makespan minus the busy time, divided by K. The formulas come from each paper
# (F, B, W are one device's share):
#
# | schedule | idle per device per iteration | source |
# |---|---|---|
# | 1F1B | (K-1)(F+B+W) | Narayanan et al. 2021; DAPPLE |
# | interleaved, v chunks | (K-1)(F+B+W)/v | Megatron-LM, SC'21, section 2.2.2 |
# | ZB-H1 | (K-1)(F+B-W) | Zero Bubble, ICLR 2024, section 3.1 |
# | ZB-H2 | 0 in the steady state, (K-1)·max(F, F+B-2W) for one iteration alone | same, section 3.1 |
# | ZB-V | (K-1)F/2 for F = B = W | same, section 6 |
# | DualPipeV | (K-1)F for F = B = W, each overlapped forward-backward pair one unit of F+B | DeepSeek-V3 technical report, section 3.2.1; PyTorch's `OVERLAP_F_B` |
#
# "Activation memory" is the peak of the first device, in units of one stage's activations for one micro-batch.

# %%
predicted = {"1f1b": (K - 1) * (F + B + W), "interleaved-1f1b": (K - 1) * (F + B + W) / 2,
             "zb-h1": (K - 1) * (F + B - W), "zb-h2": (K - 1) * max(F, F + B - 2 * W),
             "zbv": (K - 1) * F / 2, "dualpipev": (K - 1) * F}
rows = []
for name, r in results.items():
    m = r.metrics
    idle = (K * m.makespan - sum(m.busy)) / K
    rows.append({"schedule": name, "makespan": m.makespan, "idle per device": idle, "predicted": predicted[name],
                 "utilization": round(m.utilization, 3), "activation memory": m.peak_memory[0]})
    assert abs(idle - predicted[name]) < 1e-9, name
table = pd.DataFrame(rows).set_index("schedule")
print(table.to_string())
assert table["activation memory"].to_dict() == {"1f1b": 4.0, "interleaved-1f1b": 5.5, "zb-h1": 4.0, "zb-h2": 7.0,
                                                "zbv": 4.0, "dualpipev": 4.5}

# %% [markdown]
# What each one pays:
#
# - **interleaved 1F1B** halves the bubble with v = 2, but device 0 holds more activations
#   (K(1 + (K-1)/(Kv)) stages' worth: 5.5 instead of 4), every micro-batch crosses v times more device boundaries,
#   and M must be a multiple of K.
# - **ZB-H1** removes (K-1)·2W of 1F1B's idle time at no memory cost on device 0, *if* the backward can be split
#   (W runs later, so the activations needed for W are kept until then).
# - **ZB-H2** fills the warm-up with extra forwards: one iteration alone still has a fill, but back-to-back
#   iterations interlock and the steady state has no bubble at all. The price: up to 2K-1 = 7 micro-batches in flight.
# - **ZB-V** gets close to zero bubble with 1F1B's memory, because the V puts the first and the last stage on the
#   same device: a micro-batch's backward starts where its forward began.
# - **DualPipeV** pays twice ZB-V's bubble here: it runs one micro-batch's forward and another's backward as one
#   overlapped unit (PyTorch's `OVERLAP_F_B`), which starts only when the inputs of *both* are there. Its point is
#   what the pair saves: the expert-parallel all-to-all of one hides behind the other's compute (DeepSeek-V3,
#   section 3.2.1), so a pair takes less than F+B. Our cost model has no intra-stage communication; `--overlap-fb`
#   (or `overlap_fb=` in Python) says how long a pair takes, and DeepSeek's (PP/2-1)(F&B+B-3W) shrinks with it.
#
# ## ZB-H2's steady state
#
# Run two iterations back to back and subtract one: what the second iteration adds is the steady-state time.
# For ZB-H2 and ZB-V it is exactly M(F+B+W) = 24, the busy time: no bubble at all once iterations follow each
# other. 1F1B pays its full bubble again, ZB-H1 its smaller one.

# %%
for name, v in [("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("zbv", 2)]:
    extra = run(name, chunks=v, iterations=2).metrics.makespan - results[name].metrics.makespan
    print(f"{name:6s} second iteration adds {extra:g}  (busy time per iteration: {M * (F + B + W):g})")
    if name in ("zb-h2", "zbv"):
        assert extra == M * (F + B + W)
    if name == "1f1b":
        assert extra == M * (F + B + W) + (K - 1) * (F + B + W)   # a flush: the bubble comes back every iteration

# %% [markdown]
# ## When does each pay off?
#
# **When W is small**, splitting the backward gains nothing: with W = 0 (and B = 2) ZB-H1 is no better than 1F1B,
# while interleaving still helps, because it does not rely on W.

# %%
no_w = {name: run(name, chunks=v, weight=0.0, backward=2.0).metrics.makespan
        for name, v in [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("zbv", 2)]}
print(no_w)
assert no_w["zb-h1"] == no_w["1f1b"] == 33 and no_w["interleaved-1f1b"] < no_w["1f1b"]

# %% [markdown]
# **When links are slow**, every boundary crossing costs latency. Here every transfer takes 0.25 (a quarter of a
# forward):

# %%
slow = {name: run(name, chunks=v, latency=0.25).metrics.makespan for name, v in SCHEDULES}
loss = pd.DataFrame({"free links": {n: results[n].metrics.makespan for n in slow}, "latency 0.25": slow})
loss["added by latency"] = loss["latency 0.25"] - loss["free links"]
print(loss.to_string())
assert loss["added by latency"].idxmin() == "zb-h2" and loss.loc["zb-h2", "added by latency"] == 0.75
assert (loss["added by latency"] > 0).all()

# %% [markdown]
# Every schedule slows down, but not equally: ZB-H2's extra warm-up forwards give it slack to hide the latency
# (0.75 added), while the schedules that alternate tightly between forward and backward expose more of it.
#
# **Requirements.** Interleaved 1F1B needs M to be a multiple of K; DualPipeV needs M ≥ 2K. The simulator refuses
# a schedule that cannot run, with the reason, before anything starts:

# %%
for name, v, m in [("interleaved-1f1b", 2, 6), ("dualpipev", 2, 6)]:
    try:
        run(name, chunks=v, m=m)
        raise AssertionError("should have been refused")
    except ValueError as exc:
        print(f"{name}, M={m}: {exc}")

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Interleaved 1F1B with v = 4 chunks per device (same K, M, costs). What idle time per device do
# you predict, and what is the price in memory on device 0?
#
# <details><summary>Answer</summary>
#
# (K-1)(F+B+W)/v = 9/4 = 2.25 per device. Memory: K(1 + (K-1)/(Kv)) = 4 · (1 + 3/16) = 4.75 stages' worth,
# against 5.5 for v = 2 and 4 for 1F1B. (More chunks also mean v times more sends per micro-batch.)
# </details>

# %%
r4 = run("interleaved-1f1b", chunks=4)
idle4 = (K * r4.metrics.makespan - sum(r4.metrics.busy)) / K
print("idle per device", idle4, " memory on device 0", r4.metrics.peak_memory[0])
assert abs(idle4 - 2.25) < 1e-9 and abs(r4.metrics.peak_memory[0] - 4.75) < 1e-9

# %% [markdown]
# **Exercise 2.** Your model's backward splits into B = 1.5 and W = 0.5 (F = 1). Predict ZB-H1's idle time per
# device and compare with 1F1B.
#
# <details><summary>Answer</summary>
#
# ZB-H1: (K-1)(F+B-W) = 3 · 2 = 6. 1F1B: (K-1)(F+B+W) = 3 · 3 = 9. The gain is (K-1)·2W = 3: it grows with the
# share of the backward that can be deferred.
# </details>

# %%
for name, expected in [("zb-h1", 6.0), ("1f1b", 9.0)]:
    r = run(name, backward=1.5, weight=0.5)
    idle = (K * r.metrics.makespan - sum(r.metrics.busy)) / K
    print(name, idle)
    assert abs(idle - expected) < 1e-9
