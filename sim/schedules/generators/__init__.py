"""One module per schedule generator, each ``generate(cfg: PipelineConfig) -> Schedule`` with its
NAME, SUMMARY, SOURCE, BUBBLE and MEMORY strings; :mod:`sim.schedules.registry` maps CLI names to them.
"""
