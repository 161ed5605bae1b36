"""Thin CLI entry points. Each module: ``register(subparsers)`` and a lazily-importing ``run``."""
