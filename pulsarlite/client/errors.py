"""Client errors: a small hierarchy under :class:`pulsarlite.errors.PulsarliteError`.

A class exists where a caller reacts differently: bad input (fix the call), a closed object
(stop using it), a timeout (retry later or give up), a full queue (slow down), a broker error
(with the broker's ``ServerError`` name and message).
"""

from __future__ import annotations

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.errors import PulsarliteError
from pulsarlite.topic_name import InvalidTopicNameError

__all__ = [
    "ClientError", "InvalidTopicNameError", "InvalidConfiguration", "AlreadyClosed",
    "Timeout", "MessageTooBig", "ProducerQueueIsFull", "ConnectError", "BrokerError",
    "TopicNotFound", "ConsumerBusy", "ProducerBusy", "LookupError_", "NotConnected",
    "IncompatibleSchema", "AuthenticationError",
]


class ClientError(PulsarliteError):
    """Base of every error the client raises (besides InvalidTopicNameError, which the base
    package defines and which is also a ValueError)."""


class InvalidConfiguration(ClientError, ValueError):
    """An argument out of its bounds (a negative timeout, an unknown consumer type, ...)."""


class AlreadyClosed(ClientError):
    """The client, producer or consumer was closed; it cannot be used again."""


class Timeout(ClientError):
    """A bounded wait ran out (receive, send, lookup, producer/consumer creation)."""

    retriable = True


class MessageTooBig(ClientError, ValueError):
    """A message above the broker's maximum message size; nothing was sent."""


class ProducerQueueIsFull(ClientError):
    """``max_pending_messages`` are waiting and ``block_if_queue_full`` is off."""

    retriable = True


class ConnectError(ClientError):
    """A broker could not be reached, or the connection broke."""

    retriable = True


class NotConnected(ConnectError):
    """The producer or consumer is reconnecting."""


class AuthenticationError(ClientError):
    """The broker refused this client's credentials (or asked for credentials it has none of):
    not retried, the same credentials would be refused again."""


class LookupError_(ClientError):
    """The topic's owner could not be found."""

    retriable = True


class BrokerError(ClientError):
    """The broker answered with an error: ``server_error`` is its ``ServerError`` name."""

    def __init__(self, server_error: int, message: str, what: str = "") -> None:
        self.server_error = server_error
        self.server_error_name = pb.ServerError.Name(server_error) \
            if server_error in pb.ServerError.values() else str(server_error)
        self.broker_message = message
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{self.server_error_name}: {message}")

    # errors after which the same request may succeed later
    _RETRIABLE = frozenset({pb.ServiceNotReady, pb.MetadataError, pb.PersistenceError,
                            pb.TooManyRequests, pb.UnknownError})

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return self.server_error in self._RETRIABLE


class TopicNotFound(BrokerError):
    pass


class ConsumerBusy(BrokerError):
    """Another consumer holds an Exclusive subscription (or the subscription's type differs)."""


class ProducerBusy(BrokerError):
    pass


class IncompatibleSchema(BrokerError):
    """The broker refused the producer's (or consumer's) schema: the namespace's compatibility
    strategy does not accept it beside the topic's versions, or it does not allow new
    versions. Nothing was registered."""


def broker_error(server_error: int, message: str, what: str = "") -> BrokerError:
    cls = {pb.TopicNotFound: TopicNotFound, pb.ConsumerBusy: ConsumerBusy,
           pb.ProducerBusy: ProducerBusy,
           pb.IncompatibleSchema: IncompatibleSchema}.get(server_error, BrokerError)
    return cls(server_error, message, what)
