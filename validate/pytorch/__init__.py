"""PyTorch's own pipelining runtime: its schedule classes, running them, and validating against them.
"""
