"""Tenant authentication from an in-memory view of the registry's API keys.

The view holds ``sha256(secret) → (tenant, key id)`` for every key created, the set
of revoked key ids and the disabled tenants. It is fed by ``tenant.events``
(:meth:`AuthView.apply`), replayed from the beginning of the topic at start (the
registry never sends secrets or hashes over its API, and the topic is durable).
Revocation is sticky: a replayed ``ApiKeyCreated`` never resurrects a revoked key.

Until the replay has caught up (``loaded`` is False: a gateway just started or
restarted), a key the view does not know yet is not called invalid: the caller gets
UNAVAILABLE with a retry hint (:class:`KeysLoading`), so a gateway restart never
answers a valid key with 401.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from loraplane.shared.errors import PermissionDenied, Unauthenticated, Unavailable
from loraplane.v1 import events_pb2


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller."""

    tenant_id: str
    """Tenant the key belongs to."""
    key_id: str
    """Key id (for audit and logs; never the secret)."""


class MissingApiKey(Unauthenticated):
    """No ``authorization: Bearer <key>`` was sent."""

    code = "missing_api_key"


class InvalidApiKey(Unauthenticated):
    """The key is unknown or revoked."""

    code = "invalid_api_key"


class KeysLoading(Unavailable):
    """The key is not known yet because the key view is still replaying."""

    code = "keys_loading"


class TenantDisabled(PermissionDenied):
    """The key's tenant is disabled."""

    code = "tenant_disabled"


def key_hash(secret: str) -> str:
    """SHA-256 (lowercase hex) of an API key secret, as the registry stores it."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class AuthView:
    """API key hash → tenant, revocations and disabled tenants."""

    def __init__(self, *, loaded: bool = True) -> None:
        """An empty view; ``loaded=False`` until the caller says the replay caught up."""
        self.loaded = loaded
        """Whether every key created so far is in the view (the replay caught up)."""
        self._by_hash: dict[str, Principal] = {}
        self._revoked: set[str] = set()
        self._disabled: set[str] = set()
        self._tenants: set[str] = set()
        self.events_applied = 0
        """Number of events applied (for readiness and tests)."""

    def add_key(self, tenant_id: str, key_id: str, hash_hex: str) -> None:
        """Know a key (idempotent)."""
        self._by_hash[hash_hex.lower()] = Principal(tenant_id, key_id)
        self._tenants.add(tenant_id)

    def revoke(self, key_id: str) -> None:
        """Revoke a key for good (idempotent; may arrive before the key itself)."""
        self._revoked.add(key_id)

    def set_tenant(self, tenant_id: str, *, disabled: bool) -> None:
        """Know a tenant and whether it is disabled."""
        self._tenants.add(tenant_id)
        if disabled:
            self._disabled.add(tenant_id)
        else:
            self._disabled.discard(tenant_id)

    def apply(self, event: events_pb2.TenantEvent) -> None:
        """Apply one ``tenant.events`` event."""
        arm = event.WhichOneof("event")
        if arm == "api_key_created":
            c = event.api_key_created
            self.add_key(c.tenant_id, c.key_id, c.key_hash)
        elif arm == "api_key_revoked":
            self.revoke(event.api_key_revoked.key_id)
        elif arm == "tenant_upserted":
            t = event.tenant_upserted
            self.set_tenant(t.tenant_id, disabled=t.disabled)
        self.events_applied += 1

    @property
    def tenants(self) -> frozenset[str]:
        """Every tenant seen."""
        return frozenset(self._tenants)

    def authenticate(self, token: str | None) -> Principal:
        """The principal of an API key secret; raises Unauthenticated / PermissionDenied."""
        if not token:
            raise MissingApiKey("missing API key: send 'authorization: Bearer <key>'")
        principal = self._by_hash.get(key_hash(token))
        if principal is None and not self.loaded:
            raise KeysLoading("the gateway is still loading API keys (tenant.events); retry "
                              "shortly", retry_after_s=1.0)
        if principal is None or principal.key_id in self._revoked:
            raise InvalidApiKey("invalid or revoked API key")
        if principal.tenant_id in self._disabled:
            raise TenantDisabled(f"tenant {principal.tenant_id} is disabled")
        return principal
