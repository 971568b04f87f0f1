"""Vocabulary shared by every cache policy: tiers, priorities, request classes.

These are plain string enums so they serialise to the same words the registry,
the traces (``shared/traces/FORMAT.md``) and the YAML configuration use.
"""

from __future__ import annotations

from enum import Enum


class Tier(str, Enum):
    """Where a version's weights live on one worker (HOT implies WARM: the engine loads from host files)."""

    HOT = "hot"
    """Registered in the inference engine: serves requests with no load."""
    WARM = "warm"
    """Verified files on the worker host: a load costs host→GPU copy + registration."""
    COLD = "cold"
    """Only in object storage: a load costs download + verification + host→GPU + registration."""


class Priority(str, Enum):
    """Tenant (or adapter override) priority, highest first."""

    PLATINUM = "platinum"
    GOLD = "gold"
    SILVER = "silver"
    BRONZE = "bronze"


class RequestClass(str, Enum):
    """Cold-start budget class of a request (see DESIGN.md, "Cold-start budgets")."""

    INTERACTIVE = "interactive"
    """~300 ms budget: a cold start is user-visible."""
    BACKGROUND = "background"
    """~30 s budget: a cold start is tolerable."""
    CANARY = "canary"
    """Traffic to an active canary: must never meet a cold start."""


PRIORITIES: tuple[Priority, ...] = tuple(Priority)
REQUEST_CLASSES: tuple[RequestClass, ...] = tuple(RequestClass)
