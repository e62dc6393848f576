"""Authorization rules and permission transforms (broker/security/authorization.py), pure."""

from __future__ import annotations

import pytest

from broker.security.authorization import AuthorizationService, AuthPolicies, PermissionError_, TopicOperation

T = "persistent://acme/ns/orders"
L, P, C = TopicOperation.LOOKUP, TopicOperation.PRODUCE, TopicOperation.CONSUME


def test_rules():
    authz = AuthorizationService(enabled=True, superuser_roles={"su"})
    auth = AuthPolicies().grant_namespace("app", ["produce"]).grant_topic(T, "reader", ["consume"])
    admins = ("tadmin",)

    def allowed(role, op, topic=T):
        return authz.allows_topic(role, op, topic, auth, admins)

    assert all(allowed(r, op) for r in ("su", "tadmin") for op in (L, P, C))
    assert allowed("app", P) and allowed("app", L) and not allowed("app", C)
    assert allowed("reader", C) and allowed("reader", L) and not allowed("reader", P)
    assert allowed("reader", C, T + "-partition-3")            # a partition takes its topic's permissions
    assert not allowed("reader", C, "persistent://acme/ns/other")
    assert not any(allowed(r, op) for r in ("other", None) for op in (L, P, C))
    assert authz.allows_namespace_topics("app", auth, admins) and not authz.allows_namespace_topics("reader", auth, admins)
    off = AuthorizationService(enabled=False)
    assert off.allows_topic("anyone", P, T, AuthPolicies(), ()) and off.is_superuser(None)


def test_grant_revoke_and_json_roundtrip():
    auth = AuthPolicies().grant_namespace("a", ["consume", "produce"]).grant_topic(T + "-partition-0", "b", ["consume"])
    assert auth.topic_permissions(T) == {"a": {"consume", "produce"}, "b": {"consume"}}
    assert AuthPolicies.from_json(auth.to_json()) == auth
    assert auth.to_json()["destination_auth"] == {T: {"b": ["consume"]}}
    empty = auth.revoke_namespace("a").revoke_topic(T, "b")
    assert empty.to_json() == {"namespace_auth": {}, "destination_auth": {}, "subscription_auth_roles": {}}
    for bad in (lambda: auth.grant_namespace("a", ["fly"]), lambda: auth.grant_namespace("", ["produce"]),
                lambda: auth.grant_namespace("a/b", ["produce"]), lambda: AuthPolicies.from_json({"namespace_auth": []})):
        with pytest.raises(PermissionError_):
            bad()
