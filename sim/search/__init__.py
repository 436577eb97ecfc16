"""Many configurations at once: the batch evaluator, sweeps over (schedule, K, M, ...), and the planner.
"""
