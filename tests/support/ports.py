"""Port blocks for tests that bind ports of their own beside the session's test stack.

A fixed port base in a test collides with another run on the same machine (a second
session on its own ``LORAPLANE_STACK_PORT_BASE``): a helper's test stack on 23000 failed a
CI run's ``test_make_run``, whose supervisor stack was pinned to 23000. Side blocks follow
the session's base instead, so runs on different bases (1,000 apart) never share one.

In use: 1-3 test_stack_control, 4 test_component_kill, 6 test_supervisor, 7 test_make_run
(the TLS tests' own stacks sit at the base + 600 and + 650). Tests of one session run one
after another, so only blocks alive at once must differ.
"""

from __future__ import annotations

import socket

from loraplane.stack.settings import StackSettings

SIDE_BLOCK = 120
"""Ports per side block: a ``run`` profile stack spans offsets 0-18 (components) and 51-105
(services, replicas 20 apart), so 120 apart never overlap."""
BLOCKS = 7
"""Side blocks per session: 7 x 120 + 120 stay below the next base 1,000 up."""


def side_port_base(block: int) -> int:
    """Port base of side block ``block`` (1 .. :data:`BLOCKS`) of this session: its own base
    (``LORAPLANE_STACK_PORT_BASE``, else the test profile's 29000) + ``block`` x 120."""
    if not 1 <= block <= BLOCKS:
        raise ValueError(f"side block {block} is not in 1..{BLOCKS}")
    base = StackSettings(profile="test").port_base
    assert base is not None
    return base + SIDE_BLOCK * block


def free_port() -> int:
    """A port the kernel hands out now (bound and released: free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
