"""[lakehouse] The standalone turns the lake on by default (file:// tier, pyiceberg installed);
--no-lake, a non-file tier, a missing pyiceberg or an explicit broker setting say otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from faces.standalone import StandaloneSettings, lake_setting

FILE_TIER = "file:///data/tier"


@pytest.mark.parametrize("settings, tier, available, want", [
    ({}, FILE_TIER, True, (True, "")),
    ({"lake": False}, FILE_TIER, True, (False, "--no-lake")),
    ({}, "s3://bucket/tier", True, (False, "needs a file:// tier for the embedded catalog")),
    ({}, "", True, (False, "needs a file:// tier for the embedded catalog")),
    ({}, FILE_TIER, False, (False, "pyiceberg is not installed (pip install 'pulsarlite[lake]')")),
    ({"broker_settings": {"lake_enabled": False}}, FILE_TIER, True, (False, "set by the broker settings")),
    ({"lake": False, "broker_settings": {"lake_enabled": True}}, FILE_TIER, True, (True, "set by the broker settings")),
])
def test_lake_setting(settings, tier, available, want):
    assert lake_setting(StandaloneSettings(data_dir=Path("/data"), **settings), tier, available) == want
