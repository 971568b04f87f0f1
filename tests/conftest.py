"""Session-wide fixtures: the embedded test stack is started once per test session.

The test stack uses the ``test`` profile (its own ports and data directory,
``.loraplane/test-stack``), so ``make test`` passes while ``make run`` serves.
A component that cannot start fails the session: nothing is skipped because
something is missing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import Stack

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A shell that sourced make run's demo.env carries the operator's certificate: in-process
# services of a test would serve mutual TLS with it. Each test sets its own (the test stack's
# certificate of each service's identity: tests/support/tls.py).
# It names the make run gateway's CA too: the CLI under test would dial a test's plaintext
# gateway over TLS.
for _name in ("LORAPLANE_TLS_CA_FILE", "LORAPLANE_TLS_CERT_FILE", "LORAPLANE_TLS_KEY_FILE",
              "LORAPLANE_GATEWAY_CA_FILE"):
    os.environ.pop(_name, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.stack)


@pytest.fixture(scope="session")
def stack_settings() -> StackSettings:
    return StackSettings(profile="test", prometheus_scrape_interval="1s")


@pytest.fixture(scope="session")
def stack(stack_settings: StackSettings) -> Iterator[Stack]:
    """The running test stack (fresh data directory, migrated database)."""
    st = Stack(stack_settings)
    st.wipe()
    st.up()
    from loraplane.shared.migrations import migrate_up

    migrate_up(stack_settings.postgres_dsn)
    import asyncio

    from loraplane.shared.kafka_admin import ensure_topics

    asyncio.run(ensure_topics(stack_settings.kafka()))
    try:
        yield st
    finally:
        st.down()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topics, groups, buckets and databases (test isolation)."""
    return uuid.uuid4().hex[:10]
