"""From measured costs to a prediction: calibration, the rolling prediction, replays, layer profiles.
"""
