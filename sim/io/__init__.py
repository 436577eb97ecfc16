"""Files in and out, and pictures: schedules in PyTorch's formats, timelines, Chrome traces, plots.
"""
