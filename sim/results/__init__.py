"""The one output schema of simulated, measured and ingested runs: timeline, memory, metrics, Result.
"""
