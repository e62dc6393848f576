"""The broker's operating errors: one small hierarchy under :class:`BrokerError`
(docs/architecture.md#style).

A class exists only where a caller reacts differently; ``retriable`` says whether the same
request may succeed later (the admin API answers 503 for a retriable error, 500 otherwise;
the binary protocol tells ``server_error``). ``server_error`` is the Pulsar ``ServerError`` a
client is told; None: :func:`server_error_of` maps the error by its kind. The other broker
modules' errors derive from these: the managed ledger's and the cursor's
(broker/managed_ledger/core.py, broker/cursor/shell.py), ownership, compaction, schemas, the
admin API's HTTP errors (broker/admin/policies.py), authentication and authorization.

This module is a leaf of the broker: it imports only from the base floor, so every broker
module, pure cores included, imports its errors from here without a cycle.
"""

from __future__ import annotations

from pulsarlite.errors import MetadataError, PulsarliteError
from pulsarlite.topic_name import InvalidTopicNameError
from pulsarlite.wire import pb


class BrokerError(PulsarliteError):
    """Base of the broker's operating errors."""

    server_error: int | None = None


class ServiceNotReadyError(BrokerError):
    """Not now: the topic is loading or moving, a broker or ZooKeeper did not answer; retry
    (the admin API's 503)."""

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


class ProducerBlockedError(BrokerError):
    """The namespace's backlog quota is exceeded. ``hold`` (policy producer_request_hold): the
    client retries, holding its sends (ProducerBlockedQuotaExceededError); otherwise (policy
    producer_exception) the producer is refused (ProducerBlockedQuotaExceededException)."""

    def __init__(self, message: str, *, hold: bool) -> None:
        super().__init__(message)
        self.retriable = hold
        self.server_error = (pb.ProducerBlockedQuotaExceededError if hold
                             else pb.ProducerBlockedQuotaExceededException)


class ConsumerBusyError(BrokerError):
    """A subscription refuses the consumer: an Exclusive one already has a consumer, or the
    subscription exists with another type."""

    server_error = pb.ConsumerBusy


class ConsumerAssignError(BrokerError):
    """A Key_Shared consumer's sticky ranges are invalid or overlap another consumer's."""

    server_error = pb.ConsumerAssignError


class NotAllowedError(BrokerError):
    server_error = pb.NotAllowedError


class CumulativeAckNotAllowedError(NotAllowedError, ValueError):
    """A cumulative ack on a Shared or Key_Shared subscription (a ValueError too: a bad ack from
    the client changes nothing, as InvalidAckError)."""


class TopicTerminatedError(BrokerError):
    """The topic was terminated (Pulsar's terminate): it takes no more messages or producers."""

    server_error = pb.TopicTerminatedError


def server_error_of(error: BaseException) -> int:
    """The ServerError a client is told for ``error``."""
    if isinstance(error, PulsarliteError) and error.server_error is not None:
        return error.server_error          # the errors that name theirs (the managed ledger's: by retriable)
    if isinstance(error, InvalidTopicNameError):
        return pb.InvalidTopicName
    if isinstance(error, MetadataError):
        return pb.MetadataError
    if isinstance(error, PulsarliteError):
        return pb.PersistenceError if error.retriable else pb.UnknownError
    return pb.UnknownError


__all__ = ["BrokerError", "ConsumerAssignError", "ConsumerBusyError", "CumulativeAckNotAllowedError",
           "NotAllowedError", "ProducerBlockedError", "ProducerBusyError", "ProducerFencedError",
           "ServiceNotReadyError", "TopicNotFoundError", "TopicNotOwnedError", "TopicTerminatedError",
           "server_error_of"]
