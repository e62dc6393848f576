"""Topic compaction (Pulsar's two-phase compactor): pure core in core.py, shell in shell.py."""

from broker.compaction.core import (COMPACTION_CURSOR, CompactedView, CompactionError, CompactionRunningError,
                                    CompactionStatus, StatusReport, combined_status)

__all__ = ["COMPACTION_CURSOR", "CompactedView", "CompactionError", "CompactionRunningError", "CompactionStatus",
           "StatusReport", "combined_status"]
