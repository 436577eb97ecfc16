"""The schedulers: one plan of durations (:mod:`sim.engines.plan`) run by the exact fast engine or the simpy
engine, plus the collectives and replicated (data-parallel) stages.
"""
