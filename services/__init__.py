"""loraplane: control plane for serving many LoRA adapters on shared base models.

The import package ``loraplane`` is the ``services/`` directory (see
``pyproject.toml``): one sub-package per service plus the shared library
(``loraplane.shared``), the pure cache policy (``loraplane.policy``) and the
generated protobuf contracts (``loraplane.v1``).
"""

__version__ = "0.1.0"

from . import native as _native

_native.install()  # compiled policy modules when built for the current sources (native.py)
