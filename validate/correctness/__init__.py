"""Gradients and updates against one-process float64 training, and the check's power.
"""
