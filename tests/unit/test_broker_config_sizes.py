"""BrokerConfig.message_uncompressed_bytes_max: what a compressed SEND may declare (docs/decisions.md
"[compat] A compressed message above the maximum whose compressed size fits")."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from pulsarlite.errors import ConfigError


def test_the_default_bound_is_above_the_frame():
    config = BrokerConfig().validate()
    assert config.message_uncompressed_bytes_max > config.frame_bytes_max


@pytest.mark.parametrize("value", [0, -1, 1024, 2**31, True, "64"])
def test_a_bound_below_the_frame_or_beyond_int32_or_not_an_int_is_refused(value):
    with pytest.raises(ConfigError, match="message_uncompressed_bytes_max"):
        BrokerConfig(message_uncompressed_bytes_max=value).validate()


def test_a_bound_equal_to_the_frame_is_taken():
    frame = BrokerConfig().frame_bytes_max
    assert BrokerConfig(message_uncompressed_bytes_max=frame).validate().message_uncompressed_bytes_max == frame
