"""Authorization: what a role may do (Pulsar's ``PulsarAuthorizationProvider``), pure.

Rules:

- A superuser (``superuser_roles``) may do everything.
- A tenant admin (a role in the tenant's ``adminRoles``) may administer the tenant's namespaces
  and topics, and produce, consume and look up there.
- Any other role needs a permission: namespace-wide (``auth_policies.namespace_auth``: role ->
  actions) or on one topic (``auth_policies.destination_auth``: topic -> role -> actions; a
  partition takes its partitioned topic's). ``produce`` lets a role create producers, ``consume``
  consumers and readers; either lets it look the topic up (and its schema, and the namespace's
  topic list).
- Clusters, tenants and broker-wide admin calls: superusers only.

Permissions are stored with the namespace policies (Pulsar's JSON names), roles only: never a
credential. With ``authorization_enabled`` off every authenticated role may do everything.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from broker.errors import BrokerError
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import pb

# Pulsar's AuthAction names
AUTH_ACTIONS = frozenset({"produce", "consume", "functions", "sources", "sinks", "packages"})
ROLE_CHARS_MAX = 256
PERMISSIONS_MAX = 1_000          # roles per namespace or topic, and topics with permissions per namespace


class AuthorizationError(BrokerError):
    """The role is known but may not do this (HTTP 403; the binary protocol's AuthorizationError)."""

    server_error = pb.AuthorizationError


class PermissionError_(ValueError):
    """A grant that is malformed (unknown action, bad role): bad input, nothing written."""


class TopicOperation(enum.Enum):
    LOOKUP = "lookup"
    PRODUCE = "produce"
    CONSUME = "consume"


def check_role(role: object) -> str:
    if not isinstance(role, str) or not role or len(role) > ROLE_CHARS_MAX or any(ch in role for ch in "/\n\r\0"):
        raise PermissionError_(f"invalid role (1-{ROLE_CHARS_MAX} characters, no '/' or control characters)")
    return role


def check_actions(actions: object) -> frozenset[str]:
    """A JSON list of Pulsar's action names (as POST .../permissions/{role} carries)."""
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise PermissionError_("the body must be a JSON list of actions, e.g. [\"produce\", \"consume\"]")
    unknown = sorted(set(actions) - AUTH_ACTIONS)
    if unknown:
        raise PermissionError_(f"unknown action(s) {unknown[:5]}: one of {sorted(AUTH_ACTIONS)}")
    return frozenset(actions)


def _role_map(raw: object, what: str) -> dict[str, frozenset[str]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PermissionError_(f"{what} must be an object of role -> actions")
    return {check_role(role): check_actions(list(actions)) for role, actions in raw.items()}


@dataclass(frozen=True)
class AuthPolicies:
    """A namespace's permissions (Pulsar's ``auth_policies``)."""

    namespace_auth: Mapping[str, frozenset[str]] = field(default_factory=dict)
    destination_auth: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)
    subscription_auth_roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: object) -> "AuthPolicies":
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise PermissionError_("auth_policies must be an object")
        destinations = raw.get("destination_auth") or {}
        if not isinstance(destinations, Mapping):
            raise PermissionError_("destination_auth must be an object of topic -> role -> actions")
        subs = raw.get("subscription_auth_roles") or {}
        if not isinstance(subs, Mapping):
            raise PermissionError_("subscription_auth_roles must be an object")
        return cls(namespace_auth=_role_map(raw.get("namespace_auth"), "namespace_auth"),
                   destination_auth={str(t): _role_map(r, "destination_auth") for t, r in destinations.items()},
                   subscription_auth_roles={str(s): tuple(check_role(r) for r in roles)
                                            for s, roles in subs.items()})

    def to_json(self) -> dict[str, Any]:
        return {"namespace_auth": {r: sorted(a) for r, a in sorted(self.namespace_auth.items())},
                "destination_auth": {t: {r: sorted(a) for r, a in sorted(roles.items())}
                                     for t, roles in sorted(self.destination_auth.items())},
                "subscription_auth_roles": {s: list(r) for s, r in sorted(self.subscription_auth_roles.items())}}

    # -- pure transforms (CAS'd by the policy store) --------------------------------------------
    def grant_namespace(self, role: str, actions: Iterable[str]) -> "AuthPolicies":
        roles = dict(self.namespace_auth)
        roles[check_role(role)] = check_actions(list(actions))
        if len(roles) > PERMISSIONS_MAX:
            raise PermissionError_(f"more than {PERMISSIONS_MAX} roles with namespace permissions")
        return replace(self, namespace_auth=roles)

    def revoke_namespace(self, role: str) -> "AuthPolicies":
        roles = dict(self.namespace_auth)
        roles.pop(role, None)
        return replace(self, namespace_auth=roles)

    def grant_topic(self, topic: str, role: str, actions: Iterable[str]) -> "AuthPolicies":
        topic = permission_topic(topic)
        destinations = {t: dict(r) for t, r in self.destination_auth.items()}
        roles = destinations.setdefault(topic, {})
        roles[check_role(role)] = check_actions(list(actions))
        if len(roles) > PERMISSIONS_MAX or len(destinations) > PERMISSIONS_MAX:
            raise PermissionError_(f"more than {PERMISSIONS_MAX} topics or roles with topic permissions")
        return replace(self, destination_auth=destinations)

    def revoke_topic(self, topic: str, role: str) -> "AuthPolicies":
        topic = permission_topic(topic)
        destinations = {t: dict(r) for t, r in self.destination_auth.items()}
        roles = destinations.get(topic)
        if roles is not None:
            roles.pop(role, None)
            if not roles:
                del destinations[topic]
        return replace(self, destination_auth=destinations)

    def topic_permissions(self, topic: str) -> dict[str, frozenset[str]]:
        """Role -> actions on ``topic``: the namespace's, and the topic's own added (Pulsar's
        GET .../{topic}/permissions)."""
        merged = {r: set(a) for r, a in self.namespace_auth.items()}
        for role, actions in self.destination_auth.get(permission_topic(topic), {}).items():
            merged.setdefault(role, set()).update(actions)
        return {r: frozenset(a) for r, a in merged.items()}


def permission_topic(topic: str) -> str:
    """The name permissions are kept under: the full name, a partition's partitioned topic's."""
    return str(TopicName.parse(topic).partitioned_parent)


class AuthorizationService:
    """The rules above. ``enabled`` False: :meth:`allows_topic` and friends answer True."""

    def __init__(self, *, enabled: bool, superuser_roles: Iterable[str] = ()) -> None:
        self.enabled = enabled
        self.superuser_roles = frozenset(superuser_roles)

    @classmethod
    def from_config(cls, config) -> "AuthorizationService":
        return cls(enabled=config.authorization_enabled, superuser_roles=config.superuser_role_names)

    def is_superuser(self, role: str | None) -> bool:
        return not self.enabled or (role is not None and role in self.superuser_roles)

    def is_tenant_admin(self, role: str | None, admin_roles: Iterable[str]) -> bool:
        return self.is_superuser(role) or (role is not None and role in set(admin_roles))

    def allows_topic(self, role: str | None, operation: TopicOperation, topic: str, auth: AuthPolicies,
                     admin_roles: Iterable[str]) -> bool:
        if self.is_tenant_admin(role, admin_roles):
            return True
        if role is None:
            return False
        actions = set(auth.namespace_auth.get(role, ()))
        actions.update(auth.destination_auth.get(permission_topic(topic), {}).get(role, ()))
        if operation is TopicOperation.LOOKUP:
            return bool(actions & {"produce", "consume"})
        return operation.value in actions

    def allows_namespace_topics(self, role: str | None, auth: AuthPolicies, admin_roles: Iterable[str]) -> bool:
        """May list the namespace's topics: an admin, or a role with any namespace permission."""
        if self.is_tenant_admin(role, admin_roles):
            return True
        return role is not None and bool(set(auth.namespace_auth.get(role, ())) & {"produce", "consume"})


__all__ = ["AUTH_ACTIONS", "AuthPolicies", "AuthorizationError", "AuthorizationService", "PermissionError_",
           "TopicOperation", "check_actions", "check_role", "permission_topic"]
