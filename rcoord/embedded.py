"""Compatibility alias: the embedded servers live in ``rcoord.testing.embedded``."""

from .testing.embedded import *  # noqa: F403
from .testing.embedded import __all__  # noqa: F401
