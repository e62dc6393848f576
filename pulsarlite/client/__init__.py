"""pulsarlite's own Pulsar client (pure Python): the blocking API shaped like the official
``pulsar`` module. ``pulsarlite.aio`` has the same objects as coroutines.

Layout: :mod:`.core` (sans-IO protocol core, batching, routing) and :mod:`.chunking` (the pure
chunk assembler); the asyncio shell in :mod:`.connection` (connections to brokers, lookups),
:mod:`.handler` (registration retries and reconnects shared by producers and consumers),
:mod:`.producer`, :mod:`.consumer` (consumers and readers on one topic), :mod:`.multi_consumer`
(``subscribe``; several topics, partitions, patterns) and :mod:`.sink` (the receiver queues);
:mod:`.blocking` (the blocking facade on a background loop thread) and ``pulsarlite.aio`` (the
same objects as coroutines) over :mod:`.common` (their shared argument handling); :mod:`.types`,
:mod:`.errors`, :mod:`.auth`.
"""

from pulsarlite.client.auth import AuthenticationBasic, AuthenticationTLS, AuthenticationToken
from pulsarlite.client.blocking import Client, Consumer, Producer, Reader
from pulsarlite.client.errors import AuthenticationError
from pulsarlite.client.core import HashingScheme
from pulsarlite.client.errors import (IncompatibleSchema, AlreadyClosed, BrokerError, ClientError, ConnectError,
                                      ConsumerBusy, InvalidConfiguration, InvalidTopicNameError,
                                      LookupError_, MessageTooBig, NotConnected, ProducerBusy,
                                      ProducerQueueIsFull, Timeout, TopicNotFound)
from pulsarlite.client.types import (BatchingType, CompressionType, ConsumerType, InitialPosition, Message,
                                     MessageId, RegexSubscriptionMode, Result)

__all__ = [
    "Client", "Producer", "Consumer", "Reader", "BatchingType", "CompressionType", "ConsumerType",
    "InitialPosition", "Message", "MessageId", "RegexSubscriptionMode", "Result", "HashingScheme",
    "ClientError", "AlreadyClosed", "BrokerError", "ConnectError", "ConsumerBusy",
    "InvalidConfiguration", "InvalidTopicNameError", "LookupError_", "MessageTooBig",
    "NotConnected", "ProducerBusy", "ProducerQueueIsFull", "Timeout", "TopicNotFound",
    "IncompatibleSchema", "AuthenticationToken", "AuthenticationBasic", "AuthenticationTLS", "AuthenticationError",
]
