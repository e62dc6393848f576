"""The PySpark data source `pulsarlite`: segment planning, bookie and Parquet readers, stream
reader and writer (DESIGN.md §5 floor 4)."""
