"""The broker's errors that a client is told about, and the ServerError each maps to.

One small hierarchy (docs/architecture.md#style): :class:`BrokerError` and a class per case a client reacts
to differently; ``retriable`` says whether the same request may succeed later. Errors of the
layers below (managed ledger, metadata, dispatch) keep their own classes and are mapped by
:func:`server_error_of`. Every broker module imports these from here (no import cycle: this
module imports only from the floors below the broker's shells).
"""

from __future__ import annotations

from broker.dispatch import ConsumerBusyError, CumulativeAckNotAllowedError
from broker.key_shared import ConsumerAssignError
from broker.managed_ledger.core import ManagedLedgerError, ManagedLedgerFencedError
from pulsarlite.errors import MetadataError, PulsarliteError
from pulsarlite.topic_name import InvalidTopicNameError
from pulsarlite.wire import pb


class BrokerError(PulsarliteError):
    server_error = pb.UnknownError


class ServiceNotReadyError(BrokerError):
    server_error = pb.ServiceNotReady
    retriable = True


class TopicNotOwnedError(ServiceNotReadyError):
    """This broker may no longer own the topic; the client must look it up again."""


class TopicNotFoundError(BrokerError):
    server_error = pb.TopicNotFound


class ProducerBusyError(BrokerError):
    server_error = pb.ProducerBusy


class ProducerFencedError(BrokerError):
    """An exclusive producer cannot get access: the topic has other producers."""

    server_error = pb.ProducerFenced


class SubscriptionBusyError(BrokerError):
    server_error = pb.ConsumerBusy


class NotAllowedError(BrokerError):
    server_error = pb.NotAllowedError


class TopicTerminatedError(BrokerError):
    """The topic was terminated (Pulsar's terminate): it takes no more messages or producers."""

    server_error = pb.TopicTerminatedError


def server_error_of(error: BaseException) -> int:
    """The ServerError a client is told for ``error``."""
    if isinstance(error, PulsarliteError) and error.server_error is not None:
        return error.server_error          # BrokerError and the other errors that name theirs
    if isinstance(error, ConsumerBusyError):
        return pb.ConsumerBusy
    if isinstance(error, InvalidTopicNameError):
        return pb.InvalidTopicName
    if isinstance(error, ManagedLedgerError):
        return pb.ServiceNotReady if error.retriable else pb.PersistenceError
    if isinstance(error, MetadataError):
        return pb.MetadataError
    if isinstance(error, PulsarliteError):
        return pb.PersistenceError if error.retriable else pb.UnknownError
    return pb.UnknownError


__all__ = ["BrokerError", "ConsumerAssignError", "ConsumerBusyError", "CumulativeAckNotAllowedError",
           "ManagedLedgerError", "ManagedLedgerFencedError", "NotAllowedError", "ProducerBusyError",
           "ProducerFencedError", "ServiceNotReadyError", "SubscriptionBusyError", "TopicNotFoundError",
           "TopicNotOwnedError", "TopicTerminatedError", "server_error_of"]
