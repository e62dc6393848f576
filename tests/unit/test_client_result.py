"""A failed send's Result is the same in the blocking and the asyncio APIs (one mapping; the
asyncio one used to answer MessageTooBig with UnknownError)."""

import pulsarlite.aio as aio
import pulsarlite.client.blocking as blocking
from pulsarlite.client.common import result_of
from pulsarlite.client.errors import AlreadyClosed, ConnectError, MessageTooBig, Timeout
from pulsarlite.client.types import Result


def test_errors_map_to_the_official_client_results():
    assert result_of(Timeout("t")) is Result.Timeout
    assert result_of(AlreadyClosed("c")) is Result.AlreadyClosed
    assert result_of(MessageTooBig("big")) is Result.MessageTooBig
    assert result_of(ConnectError("down")) is Result.UnknownError
    assert result_of(RuntimeError("bug")) is Result.UnknownError


def test_both_apis_use_the_one_mapping():
    assert aio.result_of is result_of and blocking.result_of is result_of
    assert not hasattr(aio, "_result_of") and not hasattr(blocking, "_result_of")
