"""The PySpark data source `pulsarlite`: segment planning, bookie and Parquet readers, stream
reader and writer (docs/architecture.md#floors, floor 4).

    import spark_source
    spark_source.register(spark)
    df = (spark.read.format("pulsarlite").option("zookeeper", "127.0.0.1:2181")
          .option("topic", "persistent://public/default/t").load())

A user-given schema selects columns (only those are read and returned; docs/spark.md):

    spark.read.format("pulsarlite").schema("value binary, publish_time timestamp").option(...).load()
"""


FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark) -> None:
    """Register the data source under the name ``pulsarlite`` in ``spark``'s session.

    Spark (4.x) refuses to plan a read of a Python data source whose reader takes filters
    (``pushFilters``: ours prunes segments and row groups by ``publish_time``) unless
    ``spark.sql.python.filterPushdown.enabled`` is true, and it is false by default. So: a
    session that leaves it unset gets it turned on here; a session that set it to false keeps
    it, and the source is registered without filter pushdown (every segment is read; Spark
    still applies the filters). Either way reads work."""
    from spark_source.source import PulsarliteDataSource, PulsarliteDataSourceWithoutPushdown
    setting = spark.conf.get(FILTER_PUSHDOWN_CONF, None)
    if setting is None:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
        setting = "true"
    pushdown = str(setting).strip().lower() == "true"
    spark.dataSource.register(PulsarliteDataSource if pushdown else PulsarliteDataSourceWithoutPushdown)


def register_namespace(spark, namespace: str, **options: str) -> dict[str, str]:
    """Every persistent topic of ``namespace`` (``tenant/ns``) as a temporary view, so that
    ``spark.sql("SELECT ... FROM orders WHERE publish_time > ...")`` works (with pruning, and
    typed columns for topics with a struct schema). ``options`` are the source's (``zookeeper``
    is required). A view is named after the topic's local name, characters other than letters,
    digits and ``_`` replaced by ``_``. Returns {view name: topic}. Partitions of a partitioned
    topic are one view (its partitions together)."""
    import asyncio
    import re

    from spark_source.metadata import expand_topics
    from spark_source.options import OptionError, parse_options
    from spark_source.source import _with_metadata

    parts = namespace.strip().split("/")
    if len(parts) != 2 or not all(parts):
        raise OptionError(f"namespace must be tenant/namespace, got {namespace!r}")
    pattern = f"persistent://{parts[0]}/{parts[1]}/.*"
    from spark_source.hybrid import resolve_metadata_options
    options = resolve_metadata_options({str(k): str(v) for k, v in options.items()})
    opts = parse_options(dict(options, topicsPattern=pattern), streaming=False)

    async def run(store, client):
        return await expand_topics(store, topics=[], pattern=pattern)

    from pulsarlite.topic_name import TopicName
    parents = sorted({str(TopicName.parse(t).partitioned_parent) for t, _ in asyncio.run(_with_metadata(opts, run))})
    register(spark)
    views: dict[str, str] = {}
    for topic in parents:
        view = re.sub(r"[^A-Za-z0-9_]", "_", TopicName.parse(topic).local_name)
        reader = spark.read.format("pulsarlite")
        for k, v in options.items():
            reader = reader.option(k, v)
        reader.option("topic", topic).load().createOrReplaceTempView(view)
        views[view] = topic
    return views


def read_topic(spark, topic=None, **options):
    """See :func:`spark_source.hybrid.read_topic`."""
    from spark_source.hybrid import read_topic as _read_topic
    return _read_topic(spark, topic, **options)


def register_topic_view(spark, view: str, topic=None, **options) -> None:
    """See :func:`spark_source.hybrid.register_topic_view`."""
    from spark_source.hybrid import register_topic_view as _register
    _register(spark, view, topic, **options)


__all__ = ["read_topic", "register", "register_namespace", "register_topic_view"]
