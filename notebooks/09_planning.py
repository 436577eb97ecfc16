# %% [markdown]
# # 9. From a model and a cluster to a plan
#
# The notebooks so far took the per-stage costs as given. Before a training run nobody has them: what one has is
# a **model** (layers, hidden size, heads, vocabulary, sequence length) and a **cluster** (how many GPUs, their
# FLOP/s and memory, their links). This notebook goes from those two descriptions to a plan:
#
# 1. `sim.model.estimate` turns the model's shape into per-stage F, B and W times and bytes, with the formulas of the
#    Megatron-LM papers;
# 2. `sim.search.planner.plan` enumerates schedule x pipeline degree x tensor degree x micro-batch size x recompute,
#    simulates every candidate exactly and ranks those that fit in memory;
# 3. we tighten the memory cap and watch the winner change.
#
# The model is GPT-3 XL (1.3B parameters; Brown et al. 2020, Table 2.1) on 8 A100s.

# %%
# %matplotlib inline
from dataclasses import replace

import sim
from sim.model import gpus
from sim.io.sweep_plots import pareto_plot
from sim.model.estimate import Parallelism, activation_bytes_per_layer, estimate, pipeline_hardware
from sim.results.memory_breakdown import memory_breakdown
from sim.model.models import ModelSpec
from sim.search.planner import PlanSpace, plan, simulate_candidate
from sim.io.plots import gantt

GiB = 2**30
model = ModelSpec(name="gpt3-xl", layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048, tied_embeddings=True)
# A100 datasheet figures. The estimate times every kernel with the size-aware compute model (sim.model.efficiency:
# a GEMM's tiles run in waves over the 108 SMs, element-wise kernels are bound by memory bandwidth), so a
# micro-batch of 1 sample uses the GPU worse than one of 8, as on a real GPU.
a100 = gpus.get_gpu("a100-80gb")
print(f"{model.name}: {model.parameters / 1e9:.2f}B parameters; {a100.name}: {a100.peak_flops / 1e12:.0f} TFLOP/s, "
      f"{a100.memory_bytes / 1e9:.0f} GB")
assert round(model.parameters / 1e9, 2) == 1.31

# %% [markdown]
# ## What one layer keeps for its backward
#
# Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", 2022) count every tensor a
# transformer layer saves. Per layer and micro-batch of b samples, in bytes (Table 2):
#
# | | bytes per layer |
# |---|---|
# | no recompute | s b h (34 + 5 a s / h) |
# | selective recompute (the attention scores are recomputed) | s b h · 34 |
# | full recompute (only the layer's input is kept) | s b h · 2 |
#
# The 5 a s / h term is the attention matrix: a·s² numbers per sample, quadratic in the sequence. Here it is
# 5·16·2048/2048 = 80, more than twice the 34 of everything else.

# %%
s, h, a, b = model.seq_len, model.hidden, model.heads, 1
per_layer = {mode: activation_bytes_per_layer(model, b, recompute=mode) for mode in ("none", "selective", "full")}
for mode, nbytes in per_layer.items():
    print(f"{mode:9s} {nbytes / 2**20:8.1f} MiB per layer and sample")
assert per_layer["none"] == s * b * h * (34 + 5 * a * s / h)
assert per_layer["selective"] == s * b * h * 34 and per_layer["full"] == s * b * h * 2

# %% [markdown]
# ## Per-stage costs, and why the first stage needs more memory
#
# With 4 pipeline stages the estimate splits the 24 layers with the min-max partitioner of `pipesim partition`, counting
# the output layer (a 2048 x 51200 matrix multiply, as costly as about one layer) on the last stage, which therefore
# gets one layer fewer. Then we run
# 1F1B with 8 micro-batches and ask each device what it holds at its peak.

# %%
par = Parallelism(pipeline=4, microbatch_size=2)
est = estimate(model, a100, par)
print("layers per stage:", [hi - lo for lo, hi in est.bounds])
result = sim.simulate(sim.schedules.one_f_one_b(4, 8), est.costs, pipeline_hardware(a100, par))
for row in memory_breakdown(result):
    print(f"device {row['device']}: peak {row['peak'] / GiB:5.2f} GiB = weights {row['weights'] / GiB:.2f} + grads "
          f"{row['grads'] / GiB:.2f} + optimizer {row['optimizer'] / GiB:.2f} "
          f"+ activations {row['activations'] / GiB:.2f}")
assert [hi - lo for lo, hi in est.bounds][-1] == 5 and sum(hi - lo for lo, hi in est.bounds) == 24
breakdown = memory_breakdown(result)
assert breakdown[0]["activations"] > 3 * breakdown[3]["activations"]

# %% [markdown]
# Device 0 keeps the activations of 4 micro-batches (1F1B's warm-up sends K forwards before the first backward comes
# back), device 3 of one: "why does the first stage use more memory" is answered by the schedule, not by the model.
#
# ## The plan
#
# Now the search: 1F1B, pipeline degree 1, 2 or 4 (the rest is data parallelism, with the optimizer state sharded
# over it, ZeRO-1), micro-batch sizes 1, 2 and 4, and the three recompute modes, for a global batch of 256 samples.
# Each candidate is simulated; the iteration time adds to the pipeline's makespan the part of the data-parallel
# gradient reduction that its overlap with the last backward does not hide, and the optimizer step.

# %%
space = PlanSpace(schedules=("1f1b",), tensor=(1,), pipeline=(1, 2, 4), microbatch_sizes=(1, 2, 4),
                  recompute=("none", "selective", "full"))
G = 256
loose = plan(model, a100, gpus=8, global_batch=G, memory_cap=60 * GiB, space=space)
print(loose.ranked[["pipeline", "microbatch_size", "microbatches", "recompute", "iteration_time", "peak_memory"]]
      .head(6).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
for line in loose.explanation:
    print(line)
w = loose.winner
assert (w["pipeline"], w["microbatch_size"], w["recompute"]) == (1, 4, "none")
runner_up = loose.ranked.iloc[1]
slower = runner_up["iteration_time"] / w["iteration_time"] - 1
assert (runner_up["pipeline"], runner_up["microbatch_size"], runner_up["recompute"]) == (1, 2, "none")
assert 0.05 < slower < 0.09  # smaller GEMMs and twice the element-wise kernel launches per sample

# %% [markdown]
# The plan in the form a launcher takes: Megatron-LM's arguments (`pipesim plan --emit megatron` prints the same;
# `--emit torchtitan` a TOML fragment, `--emit csv` the schedule as PyTorch's `_load_csv` reads it).

# %%
from sim.io.launch_formats import LaunchSpec, megatron_arguments

spec = LaunchSpec.from_plan_row(model, w, layers_per_stage=w["layers_per_stage"], sequence_parallel=True,
                                distributed_optimizer=True)
print(megatron_arguments(spec))
assert "--global-batch-size 256" in megatron_arguments(spec)

# %%
pareto_plot(loose)

# %% [markdown]
# Every dot is a candidate that fits; the black line is the Pareto front: no other candidate is both faster and
# smaller. The winner sits at its fast end; moving left along the front buys memory with time.
#
# ## Tightening the cap
#
# Now the same search under smaller and smaller caps.

# %%
caps = [60, 40, 20, 11, 9, 7, 5.5]
winners = []
for cap in caps:
    w = plan(model, a100, gpus=8, global_batch=G, memory_cap=cap * GiB, space=space).winner
    winners.append((w["pipeline"], w["microbatch_size"], w["recompute"]))
    print(f"cap {cap:4} GiB: p={w['pipeline']} b={w['microbatch_size']} recompute={w['recompute']:9s} "
          f"{w['iteration_time']:.3f} s, peak {w['peak_memory'] / GiB:.1f} GiB")
assert winners == [(1, 4, "none"), (1, 2, "none"), (1, 2, "selective"), (1, 1, "selective"),
                   (2, 1, "selective"), (4, 1, "selective"), (4, 2, "full")]

# %% [markdown]
# The order in which the planner gives things up is the order of their price:
#
# 1. **smaller micro-batches** first (40 GiB): activations scale with b; the price is smaller matrices, which use
#    the GPU a little worse (the compute model's tiles and waves), and more kernel launches per sample;
# 2. then **selective recompute** (20 and 11 GiB): recomputing the attention scores removes the 5as/h term, the
#    biggest part of the activations, but re-reads and re-writes the s x s score matrix in every backward;
# 3. then **more pipeline stages** (9 and 7 GiB): each device holds a quarter of the weights, gradients and optimizer
#    state, but a pipeline has a bubble and fewer data-parallel replicas;
# 4. finally **full recompute** (5.5 GiB): a whole extra forward, but only the layer inputs are kept, which lets the
#    micro-batches grow back to 2 samples.
#
# The winner at 9 GiB, with its memory panel:

# %%
tight = plan(model, a100, gpus=8, global_batch=G, memory_cap=9 * GiB, space=space)
fig = gantt(simulate_candidate(model, a100, tight.winner, space, memory_cap=9 * GiB), memory=True)
assert tight.winner["peak_memory"] <= 9 * GiB
assert not tight.ranked.empty and (tight.ranked["peak_memory"] <= 9 * GiB).all()
print(tight.rejected["reason"].iloc[-1])

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** At 60 GiB the winner uses micro-batches of 4 samples without recompute. Why not 4 samples with
# selective recompute, which needs less memory?
#
# **Answer.** Selective recompute re-runs the attention core in every backward: 4 s² b h FLOPs per layer, a sixth of
# the layer's 24 s b h² + 4 s² b h forward FLOPs here (s = h), and, without FlashAttention, the softmax's reads and
# writes of the s x s scores, which are bound by memory bandwidth. In the table above it is about 10 % slower. When
# the candidate without recompute already fits, that time buys nothing.
#
# **Exercise 2.** Give the planner a larger global batch (G = 1024). Does the winner under 9 GiB still need 2 pipeline
# stages?
#
# **Answer.** The memory of a candidate does not depend on G (only M = G/(d b) does, and 1F1B keeps at most K
# micro-batches in flight), so the same layouts fit; but with more micro-batches the pipeline's bubble shrinks, so
# pipelining costs less and wins more easily. Run `plan(model, a100, gpus=8, global_batch=1024, memory_cap=9 * GiB,
# space=space).winner` to see it.
#
# **Exercise 3.** The command line does the same: `pipesim plan --model gpt3-175b --gpu a100-80gb --gpus 64
# --global-batch 512 -o reports/plan`. Which reasons does it give for the candidates it rejects?
#
# **Answer.** Layouts that do not divide the GPUs or the batch, tensor parallelism across nodes, a memory lower
# bound above the cap (weights, gradients and optimizer state already too large), the schedule's own rules
# (interleaving needs M to be a multiple of p), and candidates whose simulated peak is over the cap, with by how much.
