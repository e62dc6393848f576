"""Where the metadata store and the tier are, asked of a broker's admin API (shell), so that a
read needs only ``admin_url`` (as the pulsar-spark connector's does): ``GET
/admin/v2/pulsarlite/metadata`` answers ``{"zookeeper", "tierUri", "tierS3EndpointUrl"}``.

With authentication on, the call carries the token given as option ``adminToken`` or
``adminTokenFile`` (``Authorization: Bearer``); the route is for superusers (whoever reaches
ZooKeeper reaches everything: docs/security.md). Options the user gave win over what the broker
says (``zookeeper`` given: no call at all; ``s3_endpoint_url`` given: kept)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from spark_source.options import OptionError

log = logging.getLogger("pulsarlite.spark")

METADATA_PATH = "/admin/v2/pulsarlite/metadata"
TIMEOUT_S = 30
ANSWER_BYTES_MAX = 64 * 1024


def admin_token(options: dict[str, str]) -> str:
    """The admin token of the options ``adminToken`` / ``adminTokenFile`` ("" when none)."""
    from spark_source.options import _admin_token, read_admin_token
    got = _admin_token({str(k).lower(): v for k, v in options.items()})
    return read_admin_token(got["admin_token"], got["admin_token_file"])


def parse_answer(admin_url: str, body: bytes) -> dict[str, str | None]:
    """The answer's fields; OptionError naming the broker for anything else."""
    try:
        doc = json.loads(body)
        zookeeper = doc["zookeeper"]
        if not isinstance(zookeeper, str) or not zookeeper.strip():
            raise ValueError("no zookeeper")
        return {"zookeeper": zookeeper.strip(), "tier_uri": doc.get("tierUri") or None,
                "tier_s3_endpoint_url": doc.get("tierS3EndpointUrl") or None}
    except (ValueError, KeyError, TypeError) as e:
        raise OptionError(f"admin_url {admin_url}: {METADATA_PATH} gave no metadata store address ({e}); "
                          f"give the option zookeeper") from None


def discover(options: dict[str, str]) -> dict[str, str]:
    """``options`` with ``zookeeper`` (and ``s3_endpoint_url`` when the user gave none and the
    tier has one) from the broker at ``admin_url``."""
    o = {k.lower(): k for k in options}
    admin_url = str(options.get(o.get("admin_url", ""), "") or options.get(o.get("adminurl", ""), "")).strip()
    if not admin_url:
        raise OptionError("option zookeeper or admin_url is required to read")
    url = admin_url.rstrip("/") + METADATA_PATH
    token = admin_token(options)
    req = urllib.request.Request(url, headers={"Accept": "application/json",
                                               **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            body = r.read(ANSWER_BYTES_MAX + 1)
    except urllib.error.HTTPError as e:
        why = {401: "not authenticated: give adminToken or adminTokenFile",
               403: "the role is not a superuser",
               404: "the broker has no such route (older than this source?)"}.get(e.code, e.reason)
        raise OptionError(f"admin_url {admin_url}: {METADATA_PATH} answered {e.code}: {why}; "
                          f"or give the option zookeeper") from None
    except (OSError, urllib.error.URLError) as e:
        raise OptionError(f"admin_url {admin_url}: cannot ask where the metadata store is: {e}; "
                          f"or give the option zookeeper") from None
    if len(body) > ANSWER_BYTES_MAX:
        raise OptionError(f"admin_url {admin_url}: {METADATA_PATH} answer larger than {ANSWER_BYTES_MAX} bytes")
    got = parse_answer(admin_url, body)
    out = dict(options)
    out["zookeeper"] = got["zookeeper"]
    if got["tier_s3_endpoint_url"] and not any(k in o for k in ("s3_endpoint_url", "s3endpointurl")):
        out["s3_endpoint_url"] = got["tier_s3_endpoint_url"]
    log.info("metadata store from the broker admin=%s zookeeper=%s tier=%s", admin_url, got["zookeeper"],
             got["tier_uri"])
    return out


__all__ = ["METADATA_PATH", "admin_token", "discover", "parse_answer"]
