"""pipesim's validator: runs the same Schedule objects on real devices with torch.distributed.

Needs torch (``pip install 'pipesim[validate]'``); the simulator (:mod:`sim`) does not.
"""
