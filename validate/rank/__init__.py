"""What runs inside each rank: the worker, the executor, communication, tracing, workloads.

Nothing here imports the command line or the orchestrator (:mod:`validate.run`, :mod:`validate.launch`).
"""
