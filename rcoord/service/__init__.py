"""The coordinator service: timer work for the partitions each process leases."""

from .service import CoordinatorService, ServiceConfig

__all__ = ["CoordinatorService", "ServiceConfig"]
