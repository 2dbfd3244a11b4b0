"""Compatibility alias: the mock clock lives in ``rcoord.testing.clock``."""

from .testing.clock import MockTime

__all__ = ["MockTime"]
