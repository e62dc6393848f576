"""The PySpark data source `pulsarlite`: segment planning, bookie and Parquet readers, stream
reader and writer (DESIGN.md §5 floor 4).

    import spark_source
    spark_source.register(spark)
    df = (spark.read.format("pulsarlite").option("zookeeper", "127.0.0.1:2181")
          .option("topic", "persistent://public/default/t").load())
"""


def register(spark) -> None:
    """Register the data source under the name ``pulsarlite`` in ``spark``'s session."""
    from spark_source.source import PulsarliteDataSource
    spark.dataSource.register(PulsarliteDataSource)


__all__ = ["register"]
