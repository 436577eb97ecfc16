# %% [markdown]
# # 7. Validation: predict, run, compare
#
# Everything so far came from the simulator. Is it right? This notebook does what a careful engineer does before
# booking a cluster:
#
# 1. **calibrate**: time each stage's forward, backward and update, and the link, on the real machine;
# 2. **predict**: simulate the schedule with those measured costs;
# 3. **run**: execute the *same* schedule object for real, with one process per device (PyTorch, `gloo` on CPU),
#    tracing the start and end of every action;
# 4. **compare**: both timelines have the same format, so they can be laid side by side.
#
# `validate.run_validation` does all four. We run a small case: a 2-stage MLP on K = 2 CPU processes, 1F1B,
# M = 4 micro-batches, timed 3 times after two warm-up runs. It takes about half a minute, mostly to start the
# processes and calibrate.

# %%
# %matplotlib inline
import pandas as pd

import sim
from sim.io.plots import gantt
from sim.results.timeline import compute_rows
from validate import run_validation

report = run_validation("1f1b", 2, 4, workload="mlp", backend="gloo", output_dir=None, timeout=240, repeats=3,
                        workload_options={"width": 256, "depth": 2, "batch": 32})
predicted, measured = report.predicted, report.measured
print("\n".join(measured.notes))

# %% [markdown]
# ## The calibrated costs
#
# These are what the simulator was given: time per action and stage, and the link's latency and bandwidth
# fitted from a ping-pong between the two processes. The backward is measured in its two parts (input gradient
# and weight gradient); 1F1B runs them together. Stage 0's input-gradient part is almost nothing: the input data
# needs no gradient.

# %%
cal = report.calibration.to_dict()
print(pd.DataFrame({k: cal["costs"][k] for k in ("forward", "backward", "weight", "update")},
                   index=pd.Index(range(predicted.schedule.stages), name="stage")).map(lambda s: f"{s * 1e3:.2f} ms"))
print(cal["notes"])

# %% [markdown]
# ## Predicted and measured, side by side
#
# Same schedule, same time axis. The top chart is the simulator's prediction, the bottom one what happened.

# %%
gantt([predicted, measured], titles=["predicted (simulated with the calibrated costs)", "measured"])

# %% [markdown]
# Before reading the numbers, what must hold whatever the machine:
#
# - the run executed exactly the schedule's actions, each device in the schedule's order (the executor runs
#   the action list literally; it never reorders);
# - 1F1B is a flush schedule, so its gradients must equal those of one process training on the whole mini-batch
#   (notebook 2: gradient accumulation is exact).

# %%
schedule = predicted.schedule
ran = compute_rows(measured.timeline).sort_values(["device", "start"])
for d in range(schedule.devices):
    order = [f"{r.stage}{r.op}{r.microbatch}" for r in ran[ran.device == d].itertuples()]
    assert order == [str(a) for a in schedule.actions[d]], (d, order)
print("every device ran its actions in the schedule's order")
print(f"gradients equal one-process training: {report.gradients_match} "
      f"(largest relative difference {report.gradient_error:.2g}, tolerance {report.check.tolerance:.0e})")
assert report.gradients_match is True
assert measured.source == "measured" and predicted.source == "simulated"

# %% [markdown]
# ## How far off was the prediction?

# %%
d = report.to_dict()
summary = pd.DataFrame({
    "predicted": [d["predicted_makespan"] * 1e3, d["predicted_bubble_fraction"]],
    "measured": [d["measured_makespan"] * 1e3, d["measured_bubble_fraction"]],
}, index=["makespan (ms)", "bubble fraction"])
print(summary.round(3).to_string())
lo, hi = report.makespan_error_range
print(f"\nmakespan error: {report.makespan_error:+.0%} (median of {len(report.makespans)} timed runs; "
      f"p10-p90 {lo:+.0%} .. {hi:+.0%})")
print(f"noise floor: ±{report.noise:.0%} -> the error is {'significant' if report.significant else 'NOT significant'}")
print(f"per-action start error: median {report.start_error[0] * 1e3:.2f} ms, worst {report.start_error[1] * 1e3:.2f} ms")
busy_p, busy_m = sum(predicted.metrics.busy), sum(measured.metrics.busy)
idle_p = schedule.devices * predicted.metrics.makespan - busy_p
idle_m = schedule.devices * measured.metrics.makespan - busy_m
print(f"compute time, all devices: predicted {busy_p * 1e3:.1f} ms, measured {busy_m * 1e3:.1f} ms")
print(f"idle time,    all devices: predicted {idle_p * 1e3:.1f} ms, measured {idle_m * 1e3:.1f} ms")

# %% [markdown]
# ## What the error means
#
# The numbers above change from run to run and machine to machine; that is part of the lesson. First ask whether
# there is anything to explain: the **noise floor** is the larger of (a) how much the stage costs moved between the
# calibration before the timed runs and the one after, and (b) how far the timed runs' makespans spread. An error
# inside it is not evidence against the model, only against the machine's steadiness; `pipesim validate` says
# "not significant" then. A significant error splits in two:
#
# - **compute took longer (or shorter) than calibrated.** Calibration timed each stage alone; in the run, K
#   processes share the CPU cores with each other, with the communication threads of `gloo`, and with whatever
#   else runs on the machine. Calibration itself can be disturbed the same way, in either direction. On GPUs,
#   each stage has its own device and this part is usually small.
# - **more idle time than predicted.** The simulator assumes a transfer costs latency + bytes/bandwidth and
#   overlaps with compute. On a CPU, sending *is* work for the CPU, and every action pays a little fixed cost
#   (Python, the dispatcher, the trace) that the model does not contain; with actions of a few milliseconds this
#   adds up.
#
# On a small shared machine either part can dominate: the "compute time" and "idle time" lines above say which one
# did in this run. A small error says the model captures what matters for this schedule on this machine; a large
# one says which assumption to question. The structure is still right: the measured chart has the prediction's shape (warm-up,
# 1F1B steady state, cool-down) and the same order of actions. The same experiment from the command line is
# `pipesim validate`, which also writes a report.
#
# ## Exercises
#
# **Exercise 1.** Using the calibrated costs, predict how long GPipe would take on this machine with M = 8, without
# running it. How does it compare with 1F1B at M = 8?
#
# <details><summary>Answer</summary>
#
# Simulate both schedules with the calibrated costs and the fitted link (the cell below). With one stage per
# device and M ≥ K, GPipe and 1F1B have the same bubble, so the predictions come out close; the real difference
# between them is memory (notebook 3), not time. This is the use of a calibrated simulator: answering "what if"
# questions without running them.
# </details>

# %%
costs, hw = report.calibration.costs, report.calibration.hardware
pred = {name: sim.simulate(sim.schedules.generate(name, 2, 8), costs, hw) for name in ("gpipe", "1f1b")}
for name, r in pred.items():
    print(f"{name}: predicted makespan {r.metrics.makespan * 1e3:.1f} ms, in flight per device {r.metrics.peak_inflight}")
assert pred["gpipe"].metrics.peak_inflight == [8, 8] and pred["1f1b"].metrics.peak_inflight == [2, 1]

# %% [markdown]
# **Exercise 2.** If all the extra measured time were compute running slower than calibrated, by what factor would
# you scale the costs to make the prediction match? Re-simulate with the scaled costs.
#
# <details><summary>Answer</summary>
#
# The factor is measured compute time / predicted compute time (printed above). `StageCosts.scaled(factor)`
# multiplies every time. The re-simulated makespan moves toward the measured one; what remains is the idle-time
# part of the error, which scaling compute cannot explain.
# </details>

# %%
factor = busy_m / busy_p
rescaled = sim.simulate(schedule, costs.scaled(factor), hw)
print(f"scale factor {factor:.2f}: predicted {predicted.metrics.makespan * 1e3:.1f} ms -> "
      f"{rescaled.metrics.makespan * 1e3:.1f} ms; measured {measured.metrics.makespan * 1e3:.1f} ms")
assert abs(sum(rescaled.metrics.busy) - busy_m) < 1e-9 * max(1.0, busy_m)
