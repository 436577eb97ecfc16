"""What a run costs and where those costs come from: per-stage costs, hardware, layers and their partition,
GPU and model specifications, and the estimate from a model and a GPU to stage costs.
"""
