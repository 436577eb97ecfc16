# %% [markdown]
# # 10. Variability and stragglers: which schedule is robust?
#
# Every notebook so far predicted one number per schedule. Real steps vary: PRISM (arXiv 2510.15596) measured
# about 9 % GPU-time variability at 64k GPUs, and the OSDI'25 straggler study (Lin et al.) found that a few slow
# workers and pauses such as garbage collection cause most slow steps. PipeMorph (NSDI'26) then observed something
# that a single number cannot show: under network jitter, zero-bubble pipelines lost the most throughput
# (33.6 iterations/min against 41.4 for 1F1B). **The schedule with the smallest bubble on paper is not the most
# robust one.**
#
# This notebook runs `sim.monte_carlo`: many samples of the same schedule with random durations, all in one
# compiled call, and asks the same question of pipesim's own numbers.

# %%
# %matplotlib inline
import numpy as np

import sim
from sim.io.distribution_plots import makespan_cdf, tail_gantt

K, M = 4, 16
NAMES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv"]
SAMPLES = 1000


def costs_for(schedule):
    """F = B = W = 1 s per device's share (the zero-bubble papers' uniform case); each transfer takes 0.3 s."""
    share = sim.uniform(K, forward=1.0, backward=1.0, weight=1.0, send_bytes=1e6)
    chunks = schedule.stages // K
    return share.split_into_chunks(chunks) if chunks > 1 else share


hardware = sim.Hardware(devices=K, latency=0.0, bandwidth=1e6 / 0.3)


def run_all(**variability):
    """One Monte Carlo run per schedule, all with the same seed: the same action draws the same factor in every
    schedule (common random numbers), so differences between schedules are not sampling noise."""
    out = {}
    for name in NAMES:
        schedule = sim.schedules.generate(name, K, M)
        out[name] = sim.monte_carlo(schedule, costs_for(schedule), hardware, samples=SAMPLES, seed=0, **variability)
    return out


def table(runs):
    print(f"{'schedule':<18} {'nominal':>8} {'mean':>8} {'p99':>8} {'loss':>7}")
    for name, mc in runs.items():
        d = mc.summary()
        loss = 1 - d["throughput_mean"] / d["nominal_throughput"]
        print(f"{name:<18} {d['nominal_makespan']:>8.2f} {d['makespan_mean']:>8.2f} "
              f"{d['makespan_quantiles']['p99']:>8.2f} {loss:>7.1%}")


# %% [markdown]
# ## A straggler
#
# In 20 % of the steps one device, drawn at random, runs 1.5x slower (a throttled GPU, a noisy neighbour). The
# *loss* column is the mean throughput lost against the deterministic run.

# %%
stragglers = run_all(stragglers=["device=any,factor=1.5,prob=0.2"])
table(stragglers)


def loss(mc):
    return 1 - np.mean(mc.throughput) / mc.nominal.metrics.throughput


assert loss(stragglers["zb-h1"]) > loss(stragglers["1f1b"])
assert loss(stragglers["zb-h2"]) > loss(stragglers["1f1b"])

# %% [markdown]
# The zero-bubble schedules lose more than 1F1B. Why: 1F1B leaves bubbles, and a bubble is slack: when a device
# is late, the work that waits for it often would have waited anyway. ZB-H1 and ZB-H2 fill those bubbles with
# weight-gradient work (W), so the dependency chains are tight, and a slow device delays everything behind it.
# They stay the fastest in absolute terms here (their p99 is still below 1F1B's), but their margin shrinks.
#
# The CDF shows the whole distribution: the steps below 0.8 are those without a straggler, the jump is the
# straggler, and the dotted lines are the deterministic predictions.

# %%
makespan_cdf({name: stragglers[name] for name in ("1f1b", "zb-h1", "zb-h2")})

# %% [markdown]
# ## Who made it slow?
#
# For every sample pipesim follows the critical path back from the last action: each start was bound by the
# device's previous action, by an input, or by a link. The share of the path's seconds each device holds says
# where the time went. With a *fixed* straggler on device 2, it holds the largest share.

# %%
fixed = sim.monte_carlo(sim.schedules.generate("zb-h1", K, M), costs_for(sim.schedules.generate("zb-h1", K, M)),
                        hardware, samples=SAMPLES, seed=0, variability="lognormal:0.1",
                        stragglers=["device=2,factor=1.5,prob=0.5"])
path = fixed.summary()["critical_path"]
print("share of the critical path per device:", [f"{v:.0%}" for v in path["time_share"]])
assert path["slowest_device"] == 2

# %% [markdown]
# The Gantt of the p99 sample under the median one shows it: device 2's boxes are longer, and the others wait.

# %%
tail_gantt(fixed)

# %% [markdown]
# ## Network jitter
#
# PipeMorph's case: every transfer's time times a lognormal factor with CV 1 (most transfers fast, a few very
# slow).

# %%
jitter = run_all(links="lognormal:1.0")
table(jitter)
assert loss(jitter["zb-h1"]) > loss(jitter["1f1b"])

# %% [markdown]
# Again ZB-H1 loses more than 1F1B: its W work sits where 1F1B waits for the next gradient, so a late transfer is
# no longer hidden. Compute jitter alone (CV 0.2 per action, below) is different: independent small delays
# average out along a long chain, and the schedules' losses are closer. What hurts a tight schedule is a delay
# that is *correlated*: a whole device or a whole link slow at once.

# %%
compute = run_all(variability="lognormal:0.2")
table(compute)

# %% [markdown]
# ## Exercise
#
# Rank the six schedules by their p99 under the straggler above, and by their nominal makespan. Do the two
# rankings agree?
#
# ## Answer

# %%
by_p99 = sorted(NAMES, key=lambda n: np.quantile(stragglers[n].makespan, 0.99))
by_nominal = sorted(NAMES, key=lambda n: stragglers[n].nominal.metrics.makespan)
print("by p99:    ", by_p99)
print("by nominal:", by_nominal)

# %% [markdown]
# They need not: the p99 punishes a schedule whose tail is long, which is what a training job with thousands of
# steps feels. `pipesim sweep --samples 1000 --straggler device=any,factor=1.5,prob=0.2 --rank-by p99` and
# `pipesim plan ... --samples 500 --rank-by p99` rank configurations this way.
#
# ## Exercise
#
# A pause of 1 s every 10 s on every device (garbage collection at random phases). Which schedule loses most?
#
# ## Answer

# %%
pauses = run_all(pause="every=10s,length=1s")
table(pauses)
worst = max(NAMES, key=lambda n: loss(pauses[n]))
print("loses most:", worst)
# %% [markdown]
# A pause stops one device for 1 s; every schedule pays for it about once per 10 s of its own length, so the losses
# are close (about 1 s / 10 s, a bit more or less as the pause falls on the critical path or in a bubble).
