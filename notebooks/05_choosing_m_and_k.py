# %% [markdown]
# # 5. Choosing M and K
#
# Notebooks 1-3 said "more micro-batches, smaller bubble". Taken alone that would mean: always use as many
# micro-batches as possible. It is not that simple, because the **global batch is fixed** by the training recipe:
# with G samples per iteration and M micro-batches, each micro-batch has b = G/M samples, and a tiny
# micro-batch does not use a device well. This notebook sweeps M and K with `sim.search.sweep.run_sweep` and looks for the
# **knee**: the point after which more costs more than it buys.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

import sim
from sim.io.plots import sweep_utilization_plot
from sim.search.sweep import run_sweep

GiB = 2**30
G = 128                    # samples per iteration (the global batch of this pipeline)
f0, f1 = 0.5, 0.1          # forward time of a micro-batch of b samples on one stage: f0 + f1 * b


def micro_batch_costs(schedule):
    """Costs of K stages when the G samples are cut into M micro-batches of b = G / M."""
    b = G / schedule.microbatches
    fwd = f0 + f1 * b      # f0: fixed cost per micro-batch (kernel launches, small matrices use the device badly)
    return sim.uniform(schedule.stages, forward=fwd, backward=2 * fwd,
                       activation_bytes=b * 0.125 * GiB,             # activations grow with the samples
                       weight_bytes=2 * GiB, grad_bytes=2 * GiB)

# %% [markdown]
# ## Sweep M at K = 4
#
# Narayanan et al. (*Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC'21,
# section 3.3) write the time of one iteration as
#
# $$ T(b) = \Big(\frac{G}{b} + K - 1\Big) \cdot \big(t_f(b) + t_b(b)\big), $$
#
# the bubble formula of notebook 1 with M = G/b. A small b shrinks the first factor (more micro-batches, smaller
# bubble) but a fixed cost per micro-batch makes the second factor shrink slower than b.

# %%
K = 4
Ms = [1, 2, 4, 8, 16, 32, 64, 128]
df = run_sweep(["gpipe", "1f1b"], [K], Ms, costs=micro_batch_costs, progress=False)
df["samples_per_s"] = G / df["makespan"]
df["peak_GiB"] = df["peak_memory"] / GiB
print(df[["schedule", "microbatches", "makespan", "utilization", "samples_per_s", "peak_GiB"]]
      .to_string(index=False, float_format=lambda v: f"{v:.3f}"))

# %%
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
for (name, part), style in zip(df.groupby("schedule", sort=False), [dict(ls="--", marker="s", ms=8), dict(marker="o")]):
    ax1.plot(part.microbatches, part.utilization, label=name, **style)
    ax2.plot(part.microbatches, part.samples_per_s, label=name, **style)
    ax3.plot(part.microbatches, part.peak_GiB, label=name, **style)
for ax, label in [(ax1, "utilization"), (ax2, "throughput (samples / time unit)"), (ax3, "peak memory, worst device (GiB)")]:
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ms, [str(m) for m in Ms])
    ax.set_xlabel("micro-batches M (micro-batch size 128 / M)")
    ax.set_ylabel(label)
    ax.legend()
ax1.set_title("the bubble keeps shrinking ... (both schedules)")
ax2.set_title("... but throughput peaks (both schedules)")
ax3.set_title("1F1B's memory falls with M, GPipe's does not")
plt.show()

# %% [markdown]
# Three lessons from the same sweep:
#
# 1. **Utilization is not throughput.** Utilization rises all the way to M = 128, but from M = 8 on, the devices
#    are busy with fixed per-micro-batch costs, and throughput falls.
# 2. **The best M** is where the two effects balance. Setting the derivative of T to zero with
#    $t_f + t_b = 3(f_0 + f_1 G/M)$ gives $M^\ast = \sqrt{f_1 G (K-1)/f_0} \approx 8.8$; among powers of two the
#    simulation picks M = 8.
# 3. **Memory depends on the schedule.** GPipe keeps every micro-batch of the iteration, i.e. all G samples'
#    activations, whatever M is: 20 GiB. 1F1B keeps at most K micro-batches of G/M samples, so its memory falls as M
#    grows past K.

# %%
one = df[df.schedule == "1f1b"].set_index("microbatches")
gp = df[df.schedule == "gpipe"].set_index("microbatches")
best_m = int(one.samples_per_s.idxmax())
m_star = (f1 * G * (K - 1) / f0) ** 0.5
print(f"best M = {best_m}, analytic optimum {m_star:.2f}")
assert best_m == 8 and abs(m_star - 8.76) < 0.01
assert one.utilization.is_monotonic_increasing and one.loc[128, "samples_per_s"] < one.loc[8, "samples_per_s"]
assert (gp.peak_GiB == 20).all() and one.loc[8, "peak_GiB"] == 12 and one.loc[128, "peak_GiB"] == 4.5
assert ((one.makespan - gp.makespan).abs() < 1e-9).all()      # same time, different memory

# %% [markdown]
# ## Sweep K for a fixed model
#
# Now fix M = 16 (b = 8) and cut a fixed model into K stages. Its whole forward costs 0.8 per sample, so a stage
# costs f0 + 0.8 b / K, and it has 32 GiB of weights (plus as much gradient buffer), so each device holds
# 64/K GiB of them. More devices: less memory and less work per device, but a bigger bubble (K-1 grows) and the
# fixed cost f0 does not shrink.

# %%
M = 16
b = G / M


def model_costs(schedule):
    k = schedule.devices
    fwd = f0 + 0.8 * b / k
    return sim.uniform(k, forward=fwd, backward=2 * fwd, activation_bytes=b * 1 * GiB / k,
                       weight_bytes=32 * GiB / k, grad_bytes=32 * GiB / k)


Ks = [1, 2, 4, 8, 16, 32]
dk = run_sweep(["1f1b"], Ks, [M], costs=model_costs, progress=False).set_index("devices")
dk["samples_per_s"] = G / dk["makespan"]
dk["speedup"] = dk.samples_per_s / dk.samples_per_s[1]
dk["efficiency"] = dk.speedup / dk.index
dk["gain_from_doubling"] = dk.samples_per_s / dk.samples_per_s.shift(1)
dk["peak_GiB"] = dk.peak_memory / GiB
print(dk[["utilization", "samples_per_s", "speedup", "efficiency", "gain_from_doubling", "peak_GiB"]]
      .to_string(float_format=lambda v: f"{v:.3f}"))

# %%
capacity = 32
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
ax1.plot(Ks, dk.speedup, "o-", label="simulated")
ax1.plot(Ks, Ks, ":", color="grey", label="ideal: K times faster")
ax1.set_yscale("log", base=2)
ax1.set_yticks(Ks, [str(k) for k in Ks])
ax1.set_ylabel("speedup over K = 1")
ax1.set_title("throughput: the knee is at K = 4")
ax2.plot(Ks, dk.peak_GiB, "s-", color="C3", label="peak memory, worst device")
ax2.axhline(capacity, color="C3", ls="--", lw=1, label=f"capacity {capacity} GiB")
ax2.set_ylabel("GiB")
ax2.set_title("memory: K = 4 is the smallest that fits")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ks, [str(k) for k in Ks])
    ax.set_xlabel("devices K (1F1B, M = 16)")
    ax.axvline(4, color="k", lw=0.8, ls=":")
    ax.legend()
plt.show()

# %% [markdown]
# Reading the table and the plot:
#
# - up to K = 4, every doubling of the devices still gives at least 1.5x the throughput; from K = 4 to 8 only
#   1.33x, and past 16 throughput *falls*: the bubble (K-1)/(M+K-1) and the fixed costs eat the gain. K = 4 is the
#   **knee**: the last K where another doubling pays for itself.
# - memory decides the *smallest* K: with 32 GiB per device, K = 1 and K = 2 do not fit (72 and 40 GiB),
#   K = 4 does (24 GiB).
#
# So here K = 4 is both the smallest pipeline that fits and the knee. When the two disagree, the pipeline must be
# at least as deep as memory demands; to use more devices beyond the knee, add data parallelism (notebook 6)
# instead of deepening the pipeline.

# %%
knee = max(k for k in Ks[1:] if dk.loc[k, "gain_from_doubling"] >= 1.5)
smallest_fit = min(k for k in Ks if dk.loc[k, "peak_GiB"] <= capacity)
print(f"knee K = {knee}, smallest K that fits {capacity} GiB = {smallest_fit}")
assert knee == 4 and smallest_fit == 4
assert dk.loc[4, "gain_from_doubling"] >= 1.5 and abs(dk.loc[8, "gain_from_doubling"] - 1.33) < 0.01
assert dk.loc[32, "samples_per_s"] < dk.loc[16, "samples_per_s"]
assert [dk.loc[k, "peak_GiB"] for k in (1, 2, 4)] == [72, 40, 24]

# %% [markdown]
# ## The classroom case, for reference
#
# With free per-micro-batch costs (f0 = 0) throughput follows utilization, and utilization follows GPipe's
# formula (dashed) for every schedule with a flush:

# %%
classic = run_sweep(["gpipe", "1f1b"], [2, 4, 8], [1, 2, 4, 8, 16, 32], progress=False)
assert (abs(classic.utilization - classic.closed_form_utilization) < 1e-9).all()
sweep_utilization_plot(classic)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Keep K = 4 but make the fixed cost 4 times smaller (f0 = 0.125). Which M is best now?
#
# <details><summary>Answer</summary>
#
# $M^\ast = \sqrt{0.1 \cdot 128 \cdot 3 / 0.125} \approx 17.5$: a cheaper micro-batch makes more of them
# worthwhile. Among powers of two the simulation picks M = 16.
# </details>

# %%
f0 = 0.125
cheap = run_sweep(["1f1b"], [K], Ms, costs=micro_batch_costs, progress=False).set_index("microbatches")
best_cheap = int((G / cheap.makespan).idxmax())
print("best M with f0 = 0.125:", best_cheap)
assert best_cheap == 16
f0 = 0.5

# %% [markdown]
# **Exercise 2.** In the K sweep, peak memory per device falls *slower* than 1/K: from K = 1 to K = 2 it goes
# from 72 to 40 GiB, not to 36. Why?
#
# <details><summary>Answer</summary>
#
# Weights and gradients fall as 1/K (64 → 32 GiB), and so do the activations of one micro-batch on one stage
# (8 → 4 GiB). But the number of micro-batches in flight on device 0 grows with K: 1F1B keeps min(K, M) of them.
# At K = 1 that is 1 micro-batch, at K = 2 it is 2: 64 + 1·8 = 72 vs 32 + 2·4 = 40. Deeper pipelines save less
# memory per added device than the weights alone suggest.
# </details>

# %%
print("in flight on device 0:", {k: int(dk.loc[k, "peak_inflight"]) for k in Ks})
assert dk.loc[1, "peak_GiB"] == 64 + 8 and dk.loc[2, "peak_GiB"] == 32 + 2 * 4
