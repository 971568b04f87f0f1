"""Opaque page tokens and page sizes of the list RPCs."""

from __future__ import annotations

import base64
import binascii

from loraplane.shared.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    """``0`` → default; negative → INVALID_ARGUMENT; capped at :data:`MAX_PAGE_SIZE`."""
    if requested < 0:
        raise InvalidArgument(f"page_size: {requested} is negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def encode_token(cursor: str) -> str:
    """Opaque token of a cursor value."""
    return base64.urlsafe_b64encode(cursor.encode()).decode().rstrip("=")


def decode_token(token: str, field: str = "page_token") -> str:
    """Cursor value of a token (``""`` for the first page); INVALID_ARGUMENT if garbled."""
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"{field}: not a token this server issued") from exc


def decode_int_token(token: str, field: str = "page_token") -> int:
    """Integer cursor of a token (0 for the first page)."""
    text = decode_token(token, field)
    if not text:
        return 0
    if not text.isdigit():
        raise InvalidArgument(f"{field}: not a token this server issued")
    return int(text)
