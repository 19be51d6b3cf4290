"""The ``kafs`` Spark 4 Python Data Source: committed segments as a DataFrame.

    from ingest_job.source import register
    register(spark)
    df = (spark.read.format("kafs")
          .option("topics", "orders,payments")
          .option("store", "s3://bucket/prefix?endpoint=http://...")   # default file://./data
          .option("meta", "etcd://127.0.0.1:2379")                     # default embedded
          .load())

Options: ``topics`` (required), ``store``, ``meta``, ``dataDir``, ``metaPrefix``,
``segmentNamespace``, ``startingOffsets`` (JSON ``{"topic": {"partition": offset}}``),
``maxRecords``, ``unitBytes``. One input partition per run of segments of one partition;
each yields ``pyarrow.RecordBatch``es with exactly the columns of :data:`RAW_SCHEMA`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ingest_job.decode import SPARK_DDL
from ingest_job.manifest import DEFAULT_UNIT_BYTES, load_logs, plan_units
from ingest_job.model import WorkUnit, offsets_from_json
from ingest_job.task import profiled, read_unit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

MAX_BATCH_ROWS = 65536


class KafsPartition(InputPartition):
    def __init__(self, unit: WorkUnit) -> None:
        super().__init__(unit)
        self.unit = unit


class KafsReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        # Spark passes option names case-insensitively (lower-cased)
        self.options = {k.lower(): v for k, v in options.items()}
        options = self.options
        topics = options.get("topics", "")
        self.topics = tuple(t.strip() for t in topics.split(",") if t.strip())
        if not self.topics:
            raise ValueError("the kafs data source needs the option 'topics'")
        self.store_url = options.get("store", "file://./data")

    def partitions(self) -> list[InputPartition]:
        o = self.options
        logs = asyncio.run(
            load_logs(
                o.get("meta", "embedded"),
                o.get("datadir", "./data"),
                o.get("metaprefix", "/kafscale"),
                self.topics,
                o.get("segmentnamespace", "default"),
            )
        )
        starts = offsets_from_json(o["startingoffsets"]) if "startingoffsets" in o else {}
        max_records = int(o["maxrecords"]) if "maxrecords" in o else None
        plan = plan_units(logs, starts, max_records, int(o.get("unitbytes", DEFAULT_UNIT_BYTES)))
        return [KafsPartition(u) for u in plan.units]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafsPartition)
        unit = partition.unit
        cols = profiled(f"read-{unit.unit_id:05d}", read_unit, self.store_url, unit)
        for batch in cols.batches:
            for start in range(0, batch.num_rows, MAX_BATCH_ROWS):
                yield batch.slice(start, MAX_BATCH_ROWS)


class KafsDataSource(DataSource):
    """``spark.read.format("kafs")``."""

    @classmethod
    def name(cls) -> str:
        return "kafs"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafsReader(dict(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("kafs")`` available in ``spark``."""
    spark.dataSource.register(KafsDataSource)
