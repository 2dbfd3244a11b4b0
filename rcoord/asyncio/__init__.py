"""The asyncio front end: the same scripts and the same sans-I/O core as the blocking API."""

from .coordinator import AsyncGroupCoordinator

__all__ = ["AsyncGroupCoordinator"]
