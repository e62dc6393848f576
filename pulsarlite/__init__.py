"""pulsarlite: a segmented-stream storage engine after Apache Pulsar and Apache BookKeeper."""

__version__ = "0.1.0"
