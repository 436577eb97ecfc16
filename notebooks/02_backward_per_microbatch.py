# %% [markdown]
# # 2. Why the backward stays per micro-batch
#
# In notebook 1 every device ran M separate backwards, one per micro-batch. Why not let the last device
# collect all M micro-batches and run **one** big backward? This notebook shows:
#
# 1. a backward needs the activations of *its own* forward, so each micro-batch's backward is its own job;
# 2. the gradients of the micro-batches are simply added up (**gradient accumulation**), and the weights are
#    updated once, at the end;
# 3. what this costs in memory: the activations of every micro-batch that has run its forward but not yet its
#    backward.

# %%
# %matplotlib inline
import numpy as np

import sim
from sim.io.plots import gantt, memory_plot

GiB = 2**30

# %% [markdown]
# ## A backward needs its own forward's activations
#
# Take one linear layer, $y = x W$, inside a network with loss $L$. The backward receives $\partial L/\partial y$
# from the layer above and computes
#
# $$ \frac{\partial L}{\partial W} = x^\top \frac{\partial L}{\partial y}, \qquad
#    \frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} W^\top . $$
#
# The weight gradient uses $x$, the input this layer saw in the forward of *the same* micro-batch. That is why a
# device keeps ("stashes") the activations of a micro-batch from its forward until its backward. A small numpy
# check: four micro-batches of 8 samples, a squared-error loss.

# %%
rng = np.random.default_rng(0)
W = rng.normal(size=(5, 3))
x = rng.normal(size=(32, 5))          # the mini-batch: 32 samples
target = rng.normal(size=(32, 3))


def grad_W(x, target, n_total):
    """dL/dW for L = sum of squared errors / n_total, over the samples in x."""
    dy = 2 * (x @ W - target) / n_total   # dL/dy, what the layer above sends back
    return x.T @ dy                       # needs x: the activations kept from the forward


full = grad_W(x, target, 32)
parts = [grad_W(x[i:i + 8], target[i:i + 8], 32) for i in range(0, 32, 8)]   # 4 micro-batches
accumulated = sum(parts)
print("accumulated micro-batch gradients == full-batch gradient:", np.allclose(accumulated, full))
assert np.allclose(accumulated, full)

# pairing micro-batch 1's upstream gradient with micro-batch 0's activations gives a wrong gradient
dy1 = 2 * (x[8:16] @ W - target[8:16]) / 32
wrong = x[0:8].T @ dy1
print("with another micro-batch's activations:", np.allclose(wrong, parts[1]))
assert not np.allclose(wrong, parts[1])

# %% [markdown]
# So the sum of the per-micro-batch gradients *is* the gradient of the whole mini-batch: splitting into
# micro-batches changes nothing in the mathematics, as long as every micro-batch's backward uses its own
# activations and the weights stay the same until all gradients are in (GPipe paper, section 2.2).
#
# ## What if the last device merged the backwards?
#
# The last device could wait for all M forwards, then run one backward over the whole mini-batch (M times as
# long), send one big gradient to the device before it, and so on. Mathematically that is allowed (the
# activations of all micro-batches are there). But then the backward is no longer pipelined: the devices run it
# one after the other, like naive model parallelism. We simulate the two halves separately: a pipelined forward
# (backward cost 0), then one micro-batch of size M going backward through K devices (forward cost 0).

# %%
K, M, F, B = 4, 4, 1.0, 2.0
forward_part = sim.simulate(sim.schedules.gpipe(K, M), sim.uniform(K, forward=F, backward=0)).metrics.makespan
merged_backward = sim.simulate(sim.schedules.naive(K, 1), sim.uniform(K, forward=0, backward=M * B)).metrics.makespan
gpipe = sim.simulate(sim.schedules.gpipe(K, M), sim.uniform(K, forward=F, backward=B))
print(f"merged backward: {forward_part:g} + {merged_backward:g} = {forward_part + merged_backward:g}")
print(f"per-micro-batch backward (GPipe): {gpipe.metrics.makespan:g}")
assert forward_part == (M + K - 1) * F and merged_backward == K * M * B
assert forward_part + merged_backward == 39 and gpipe.metrics.makespan == 21

# %% [markdown]
# 39 time units instead of 21: keeping the backward per micro-batch lets it flow through the pipeline like the
# forward did.
#
# ## Gradient accumulation: one update at the end
#
# Each device's list of actions ends with `U`, the optimizer step of its stage. Before it, every backward added
# its gradient into one gradient buffer. Here is GPipe's schedule as text (`0F1` = stage 0, forward, micro-batch 1):

# %%
schedule = sim.schedules.gpipe(K, M)
print(schedule.to_text())
for d in range(K):
    kinds = [a.kind for a in schedule.actions[d]]
    assert kinds[-1] is sim.ActionKind.U and kinds.count(sim.ActionKind.U) == 1   # one update, last

# %% [markdown]
# ## What it costs in memory
#
# Suppose each stage has 1 GiB of weights and 1 GiB of gradient buffer, and keeps 0.5 GiB of activations per
# micro-batch between its forward and its backward. In GPipe every device finishes all M forwards before the
# first backward, so at the peak it holds the activations of all M micro-batches:
#
# $$ \text{peak} = \underbrace{w + g}_{\text{weights + gradient buffer}} + M \cdot a $$
#
# The gradient buffer does not grow with M: accumulation adds into the same buffer. The activations do.

# %%
w = g = 1 * GiB
a = 0.5 * GiB
mem_costs = sim.uniform(K, forward=F, backward=B, weight_bytes=w, grad_bytes=g, activation_bytes=a)
gp = sim.simulate(sim.schedules.gpipe(K, M), mem_costs)
nv = sim.simulate(sim.schedules.naive(K, M), mem_costs)
print("GPipe peak per device (GiB):", [p / GiB for p in gp.metrics.peak_memory])
print("naive peak per device (GiB):", [p / GiB for p in nv.metrics.peak_memory])
assert all(p == w + g + M * a for p in gp.metrics.peak_memory)       # 4 GiB
assert all(p == w + g + a for p in nv.metrics.peak_memory)           # 2.5 GiB
memory_plot(gp)

# %% [markdown]
# Each device's memory climbs by 0.5 GiB with every forward, peaks when the last forward is done, and falls back
# with every backward. The same picture under the timeline:

# %%
gantt(gp, titles=["GPipe with memory"], memory=True)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** With the numbers above, what is GPipe's peak per device at M = 8? And what is the largest M
# that fits a 16 GiB device?
#
# <details><summary>Answer</summary>
#
# Peak = 2 + 8 · 0.5 = 6 GiB. To fit 16 GiB: 2 + M · 0.5 ≤ 16, so M ≤ 28.
# </details>

# %%
peak8 = max(sim.simulate(sim.schedules.gpipe(K, 8), mem_costs).metrics.peak_memory)
fits = [m for m in range(1, 40)
        if max(sim.simulate(sim.schedules.gpipe(K, m), mem_costs).metrics.peak_memory) <= 16 * GiB]
print(f"peak at M=8: {peak8 / GiB:g} GiB; largest M within 16 GiB: {max(fits)}")
assert peak8 == 6 * GiB and max(fits) == 28

# %% [markdown]
# **Exercise 2.** Accumulating gradients over micro-batches gives exactly the full-batch gradient. Why would the
# result differ if every micro-batch's backward were followed at once by its own weight update?
#
# <details><summary>Answer</summary>
#
# Because micro-batch 1's gradient would then be computed with weights already changed by micro-batch 0: it is
# no longer the gradient of the mini-batch loss at one point. That is PipeDream's asynchronous update
# (notebook 4); GPipe and 1F1B avoid it by updating once, after the flush. The check below updates after each
# micro-batch with plain SGD and compares.
# </details>

# %%
lr = 0.1
W_acc = W - lr * full                       # one update with the accumulated gradient
W_seq = W.copy()
for i in range(0, 32, 8):                   # an update after every micro-batch
    dy = 2 * (x[i:i + 8] @ W_seq - target[i:i + 8]) / 32
    W_seq = W_seq - lr * (x[i:i + 8].T @ dy)
print("max difference between the two results:", float(np.abs(W_acc - W_seq).max()))
assert not np.allclose(W_acc, W_seq)
