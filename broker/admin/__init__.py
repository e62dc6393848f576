"""The broker's admin face: namespace policies in ZooKeeper (:mod:`.policies`), the admin v2
HTTP API (:mod:`.http`) and Prometheus metrics (:mod:`.metrics`)."""

from broker.admin.api import AdminBackend
from broker.admin.http import make_admin_app
from broker.admin.metrics import BrokerMetrics, MetricsConfig
from broker.admin.policies import (AdminError, BadRequestError, ConflictError, NamespacePolicies, NotFoundError,
                                   PolicyStore, PreconditionFailedError)

__all__ = ["AdminBackend", "make_admin_app", "BrokerMetrics", "MetricsConfig", "AdminError", "BadRequestError",
           "ConflictError", "NamespacePolicies", "NotFoundError", "PolicyStore", "PreconditionFailedError"]
