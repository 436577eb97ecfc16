"""Subcommands of ``pipesim``: each module has ``register(subparsers)`` and sets ``func``."""
