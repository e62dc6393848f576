"""[security] The permission matrix against a real secured broker (token authentication,
authorization on): superuser, tenant admin, a role granted namespace permissions, a role granted
a topic permission, another role, and an anonymous client, over produce, consume, lookup and
admin calls, with the official client and the HTTP API. Then revoking takes effect."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import jwt
import pytest

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
SECRET = os.urandom(32)
TOPIC = "persistent://acme/ns/orders"
ROLES = ("su", "tadmin", "app", "reader", "other", None)      # None: no credentials (anonymous role)


def token(sub: str) -> str:
    return jwt.encode({"sub": sub}, SECRET, algorithm="HS256")


def http(cluster, method: str, path: str, role: str | None, body=None) -> tuple[int, object]:
    headers = {"Content-Type": "application/json"}
    if role is not None:
        headers["Authorization"] = f"Bearer {token(role)}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(cluster.admin_url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, module_tmp_path):
    key = module_tmp_path / "secret.key"
    key.write_bytes(SECRET)
    cluster = module_cluster_factory(3, brokers=1, broker_overrides={
        "authentication_enabled": True, "authentication_providers": "token", "authorization_enabled": True,
        "superuser_roles": "su", "anonymous_user_role": "anon", "token_secret_key": f"file://{key}"})
    assert http(cluster, "PUT", "/admin/v2/tenants/acme", "su",
                {"adminRoles": ["tadmin"], "allowedClusters": ["standalone"]})[0] == 204
    assert http(cluster, "PUT", "/admin/v2/namespaces/acme/ns", "su")[0] == 204
    assert http(cluster, "POST", "/admin/v2/namespaces/acme/ns/permissions/app", "tadmin",
                ["produce", "consume"])[0] == 204
    assert http(cluster, "POST", "/admin/v2/persistent/acme/ns/orders/permissions/reader", "tadmin",
                ["consume"])[0] == 204
    return cluster


def client_for(cluster, role: str | None):
    auth = pulsar.AuthenticationToken(token(role)) if role is not None else None
    return pulsar.Client(cluster.service_url, authentication=auth, operation_timeout_seconds=5)


def can_produce(cluster, role) -> bool:
    client = client_for(cluster, role)
    try:
        client.create_producer(TOPIC).send(b"from %s" % str(role).encode())
        return True
    except Exception as e:      # noqa: BLE001 - refused: the kind is checked in the broker's log
        assert "AuthorizationError" in type(e).__name__ or "uthoriz" in str(e) or "TimeOut" in str(e), e
        return False
    finally:
        client.close()


def can_consume(cluster, role) -> bool:
    client = client_for(cluster, role)
    try:
        client.subscribe(TOPIC, f"sub-{role}", initial_position=pulsar.InitialPosition.Earliest)
        return True
    except Exception as e:      # noqa: BLE001
        assert "AuthorizationError" in type(e).__name__ or "uthoriz" in str(e) or "TimeOut" in str(e), e
        return False
    finally:
        client.close()


EXPECTED = {
    #          produce consume lookup ns-admin superuser-admin
    "su":     (True,   True,   200,   200,     204),
    "tadmin": (True,   True,   200,   200,     403),
    "app":    (True,   True,   200,   403,     403),
    "reader": (False,  True,   200,   403,     403),
    "other":  (False,  False,  403,   403,     403),
    None:     (False,  False,  403,   403,     403),
}


@pytest.mark.parametrize("role", ROLES, ids=[str(r) for r in ROLES])
def test_permission_matrix(cluster, role):
    produce, consume, lookup, ns_admin, su_admin = EXPECTED[role]
    assert can_produce(cluster, role) is produce
    assert can_consume(cluster, role) is consume
    # refused for the right reason: no permission at all fails the lookup, consume-only the producer
    log = open(cluster.records["broker-1"].log, errors="replace").read()
    refused = {"reader": "operation=produce", "other": "operation=lookup", None: "operation=lookup"}.get(role)
    name = role or "anon"
    if refused is None:
        assert f"authorization refused role={name} " not in log
    else:
        assert f"authorization refused role={name} {refused} topic={TOPIC}" in log
    assert http(cluster, "GET", "/lookup/v2/topic/persistent/acme/ns/orders", role)[0] == lookup
    assert http(cluster, "GET", "/admin/v2/persistent/acme/ns/orders/stats", role)[0] == lookup
    status, body = http(cluster, "GET", "/admin/v2/namespaces/acme/ns/permissions", role)
    assert status == ns_admin
    if status == 200:
        assert body == {"app": ["consume", "produce"]}
    else:
        assert "not an admin of tenant acme" in body["reason"]
    assert http(cluster, "PUT", f"/admin/v2/tenants/t-{role}", role, {"allowedClusters": ["standalone"]})[0] \
        == su_admin
    assert http(cluster, "GET", "/admin/v2/tenants/acme", role)[0] == ns_admin
    assert http(cluster, "GET", "/admin/v2/namespaces/acme", role)[0] == ns_admin


def test_topic_permissions_merge_and_revoke(cluster):
    status, body = http(cluster, "GET", "/admin/v2/persistent/acme/ns/orders/permissions", "tadmin")
    assert status == 200 and body == {"app": ["consume", "produce"], "reader": ["consume"]}
    # bad input changes nothing
    assert http(cluster, "POST", "/admin/v2/namespaces/acme/ns/permissions/x", "tadmin", ["fly"])[0] == 400
    assert http(cluster, "POST", "/admin/v2/namespaces/acme/ns/permissions/x", "tadmin", {"a": 1})[0] == 400
    assert http(cluster, "DELETE", "/admin/v2/namespaces/acme/ns/permissions/app", "tadmin")[0] == 204
    assert http(cluster, "DELETE", "/admin/v2/persistent/acme/ns/orders/permissions/reader", "tadmin")[0] == 204
    assert http(cluster, "GET", "/admin/v2/namespaces/acme/ns/permissions", "tadmin") == (200, {})
    assert not can_produce(cluster, "app")
    assert not can_consume(cluster, "reader")
    # the permissions live with the namespace policies (Pulsar's auth_policies), roles only
    status, policies = http(cluster, "GET", "/admin/v2/namespaces/acme/ns", "su")
    assert status == 200 and policies["auth_policies"]["namespace_auth"] == {}
    assert http(cluster, "POST", "/admin/v2/namespaces/acme/ns/permissions/app", "app", ["produce"])[0] == 403


def test_cli_grant_permissions_and_revoke(cluster, capsys):
    """`pulsarlite admin namespaces|topics grant-permission | permissions | revoke-permission` as
    the tenant admin; the granted role can then produce; a role that is not an admin is refused."""
    from faces.cli import main as cli_main

    def admin(role, *args) -> int:
        return cli_main(["admin", "--admin-url", cluster.admin_url, "--auth-plugin", "token",
                         "--auth-params", f"token:{token(role)}", *args])

    assert admin("tadmin", "namespaces", "grant-permission", "acme/ns", "--role", "cli", "--actions",
                 "produce,consume") == 0
    assert admin("tadmin", "topics", "grant-permission", TOPIC, "--role", "cli-topic", "--actions", "consume") == 0
    capsys.readouterr()
    assert admin("tadmin", "namespaces", "permissions", "acme/ns", "-o", "json") == 0
    assert json.loads(capsys.readouterr().out) == {"cli": ["consume", "produce"]}
    assert admin("tadmin", "topics", "permissions", TOPIC, "-o", "json") == 0
    assert json.loads(capsys.readouterr().out) == {"cli": ["consume", "produce"], "cli-topic": ["consume"]}
    assert can_produce(cluster, "cli")
    assert admin("other", "namespaces", "grant-permission", "acme/ns", "--role", "other", "--actions",
                 "produce") != 0
    assert admin("tadmin", "namespaces", "grant-permission", "acme/ns", "--role", "x", "--actions", "fly") != 0
    assert admin("tadmin", "namespaces", "revoke-permission", "acme/ns", "--role", "cli") == 0
    assert admin("tadmin", "topics", "revoke-permission", TOPIC, "--role", "cli-topic") == 0
    capsys.readouterr()
    assert admin("tadmin", "topics", "permissions", TOPIC, "-o", "json") == 0
    assert json.loads(capsys.readouterr().out) == {}
    assert not can_produce(cluster, "cli")


@pytest.fixture(scope="module")
def two_brokers(module_cluster_factory, module_tmp_path):
    key = module_tmp_path / "secret2.key"
    key.write_bytes(SECRET)
    return module_cluster_factory(3, brokers=2, name="two", broker_overrides={
        "authentication_enabled": True, "authentication_providers": "token", "authorization_enabled": True,
        "superuser_roles": "su", "token_secret_key": f"file://{key}"})


def test_admin_calls_to_the_owner_carry_the_callers_role(two_brokers):
    """partitioned-stats of a topic whose partitions two brokers own: the first broker asks the
    other's admin API for its partitions with the caller's credentials (else the owner answers 401)."""
    cluster = two_brokers
    admins = [f"http://127.0.0.1:{cluster.records[n].ports['http']}" for n in cluster.broker_names]
    assert http(cluster, "PUT", "/admin/v2/persistent/public/default/spread/partitions", "su", 8)[0] == 204
    owners = set()
    for i in range(8):       # place each partition (lookup, then the authoritative lookup at the broker named)
        path = f"/lookup/v2/topic/persistent/public/default/spread-partition-{i}"
        status, named = http(cluster, "GET", path, "su")
        assert status == 200, named
        chosen = named["httpUrl"].rstrip("/")
        request = urllib.request.Request(chosen + path + "?authoritative=true",
                                         headers={"Authorization": f"Bearer {token('su')}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            owners.add(json.loads(response.read())["httpUrl"].rstrip("/"))
    assert owners == set(admins), owners
    status, stats = http(cluster, "GET", "/admin/v2/persistent/public/default/spread/partitioned-stats?perPartition=true",
                         "su")
    assert status == 200 and len(stats["partitions"]) == 8, stats
    assert http(cluster, "GET", "/admin/v2/persistent/public/default/spread/partitioned-stats", "other")[0] == 403
