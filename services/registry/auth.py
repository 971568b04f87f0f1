"""Operator authentication of the registry admin API.

An operator proves who they are with the ``operator`` client certificate (mutual TLS on,
:mod:`loraplane.shared.tls`) or with ``authorization: Bearer <operator token>``
(``LORAPLANE_REGISTRY_OPERATOR_TOKEN``; a CI pipeline, the gateway's bootstrap). Neither
→ UNAUTHENTICATED (no certificate) or PERMISSION_DENIED (a certificate of another
identity); anything else than the operator token (including a tenant's API key) →
PERMISSION_DENIED; counted in ``loraplane_grpc_auth_refusals_total``. With mutual TLS on
a caller also needs a certificate of the platform's CA to connect at all. Health checks
and reflection are not guarded. The optional ``x-loraplane-actor`` metadata
names who acts (audit log); it is informational, the token is the credential.
"""

from __future__ import annotations

import hmac
import re

from loraplane.shared.errors import InvalidArgument, PermissionDenied, Unauthenticated
from loraplane.shared.grpcutil import Metadata, bearer_token, metadata_value
from loraplane.shared.tls import OPERATOR, Rule, allow

ADMIN_SERVICE = "loraplane.v1.RegistryAdmin"
ACTOR_METADATA = "x-loraplane-actor"
"""Metadata key naming the acting person or pipeline (e.g. ``ci/acme-release``)."""
DEFAULT_ACTOR = "operator"
ACTOR_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:/+-]{0,127}$")


def is_admin_method(full_method: str) -> bool:
    """Whether ``/pkg.Service/Method`` belongs to RegistryAdmin (guarded)."""
    return full_method.startswith(f"/{ADMIN_SERVICE}/")


class OperatorAuth:
    """Checks the operator bearer token (constant-time comparison)."""

    def __init__(self, token: str) -> None:
        """``token``: the operator token; must not be empty."""
        if not token:
            raise ValueError("an operator token is required")
        self._token = token.encode("utf-8")

    def __call__(self, metadata: Metadata, full_method: str) -> None:
        """Raise ``Unauthenticated`` / ``PermissionDenied`` unless the token matches."""
        presented = bearer_token(metadata)
        if presented is None:
            raise Unauthenticated(
                "missing operator token: send 'authorization: Bearer <token>'"
            )
        if not hmac.compare_digest(presented.encode("utf-8"), self._token):
            raise PermissionDenied(f"{full_method}: the token is not the operator token")


def admin_rules(auth: OperatorAuth) -> dict[str, Rule]:
    """The authorization table of RegistryAdmin: the operator certificate or token."""
    return {f"/{ADMIN_SERVICE}/": allow(OPERATOR, token=auth)}


def actor_of(metadata: Metadata) -> str:
    """The actor named in metadata (``x-loraplane-actor``), default ``operator``."""
    actor = metadata_value(metadata, ACTOR_METADATA)
    if not actor:
        return DEFAULT_ACTOR
    if not ACTOR_RE.fullmatch(actor):
        raise InvalidArgument(f"{ACTOR_METADATA}: {actor!r} is not a valid actor name")
    return actor
