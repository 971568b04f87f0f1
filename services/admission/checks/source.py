"""Source check: the artifact location is inside the allow-listed bucket and tenant prefix.

The grammar is :func:`loraplane.shared.objectstore.check_location` (the worker checks
every load command with the same one); this module turns its findings into admission
problems (``SOURCE_NOT_ALLOWED``) and resolves the signature's location.
"""

from __future__ import annotations

from loraplane.admission.problems import SOURCE_NOT_ALLOWED, Problem
from loraplane.shared import objectstore
from loraplane.shared.objectstore import S3Location
from loraplane.shared.signing import SIGNATURE_FILENAME

__all__ = ["S3Location", "check_location", "check_source"]


def check_location(
    uri: str,
    *,
    tenant_id: str,
    bucket: str,
    prefix: str,
    directory: bool,
    what: str = "artifact_uri",
) -> tuple[S3Location | None, list[Problem]]:
    """:func:`loraplane.shared.objectstore.check_location`, every problem as a
    ``SOURCE_NOT_ALLOWED`` :class:`Problem` on ``what``."""
    location, messages = objectstore.check_location(
        uri, tenant_id=tenant_id, bucket=bucket, prefix=prefix, directory=directory, what=what)
    return location, [Problem(SOURCE_NOT_ALLOWED, m, path=what) for m in messages]


def check_source(
    artifact_uri: str,
    signature_uri: str,
    *,
    tenant_id: str,
    bucket: str,
    prefix: str,
) -> tuple[S3Location | None, S3Location | None, list[Problem]]:
    """Check both locations of a release.

    Returns ``(artifact root, signature object, problems)``. An empty ``signature_uri``
    means the signature is ``model.sig`` (:data:`SIGNATURE_FILENAME`) inside the artifact root. Both locations are
    ``None`` unless every problem list is empty.
    """
    root, problems = check_location(
        artifact_uri, tenant_id=tenant_id, bucket=bucket, prefix=prefix, directory=True
    )
    sig: S3Location | None = None
    if signature_uri:
        sig, sig_problems = check_location(
            signature_uri, tenant_id=tenant_id, bucket=bucket, prefix=prefix,
            directory=False, what="signature_uri",
        )
        problems = [*problems, *sig_problems]
    elif root is not None:
        sig = S3Location(root.bucket, root.key + SIGNATURE_FILENAME)
    if problems:
        return None, None, problems
    return root, sig, []
