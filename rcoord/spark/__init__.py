"""rcoord for Spark: the ``rcoord`` data source for PySpark (``pip install 'rcoord[spark]'``).

::

    from rcoord.spark import register
    register(spark)
    df = spark.read.format("rcoord").option("subscribe", "events").load()

Options, planning, group membership and the write path are plain Python modules
(``options``, ``plan``, ``resolve``, ``member``, ``write``) that import no Spark; only
``source`` (the adapter) imports pyspark, and only when ``register`` or ``data_source`` is
called.
"""

from __future__ import annotations

from typing import Any

from .options import OptionError

__all__ = ["OptionError", "data_source", "register"]


def data_source() -> Any:
    """The ``DataSource`` class (imports pyspark)."""
    from .source import RcoordDataSource

    return RcoordDataSource


def register(spark: Any) -> None:
    """Register the ``rcoord`` format with a SparkSession."""
    spark.dataSource.register(data_source())
