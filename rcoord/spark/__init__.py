"""rcoord for Spark: the ``rcoord`` data source for PySpark (``pip install 'rcoord[spark]'``).

::

    from rcoord.spark import register
    register(spark)
    df = spark.read.format("rcoord").option("subscribe", "events").load()

Options, planning, group membership and the write path are plain Python modules
(``options``, ``plan``, ``resolve``, ``member``, ``write``, ``replays``) that import no Spark;
only ``source`` (the adapter) imports pyspark, and only when ``register`` or ``data_source``
is called. ``batch_generation`` serves ``foreachBatch`` sinks that name their output by
generation (see ``replays``).
"""

from __future__ import annotations

from typing import Any

from .options import OptionError
from .replays import batch_generation

__all__ = ["OptionError", "batch_generation", "data_source", "register"]


def data_source() -> Any:
    """The ``DataSource`` class (imports pyspark)."""
    from .source import RcoordDataSource

    return RcoordDataSource


def register(spark: Any) -> None:
    """Register the ``rcoord`` format with a SparkSession."""
    spark.dataSource.register(data_source())
