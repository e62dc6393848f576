"""pulsarlite: a segmented-stream storage engine after Apache Pulsar and Apache BookKeeper.

``import pulsarlite`` stays cheap (bookies and brokers import the base package): the client API
(``pulsarlite.Client``, ``pulsarlite.MessageId``, ``pulsarlite.CompressionType``, ...) is loaded
on first use through the module ``__getattr__`` below. ``pulsarlite.aio`` is the asyncio API.
"""

__version__ = "0.1.0"

_CLIENT_NAMES = frozenset({
    "Client", "Producer", "Consumer", "Reader", "BatchingType", "CompressionType", "ConsumerType",
    "InitialPosition", "Message", "MessageId", "Result", "HashingScheme",
    "ClientError", "AlreadyClosed", "BrokerError", "ConnectError", "ConsumerBusy",
    "InvalidConfiguration", "InvalidTopicNameError", "LookupError_", "MessageTooBig",
    "NotConnected", "ProducerBusy", "ProducerQueueIsFull", "Timeout", "TopicNotFound",
    "IncompatibleSchema", "AuthenticationToken", "AuthenticationBasic", "AuthenticationTLS", "AuthenticationError",
})


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from pulsarlite import client
        value = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pulsarlite' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _CLIENT_NAMES)
