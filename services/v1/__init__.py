"""Generated protobuf and gRPC code for ``proto/loraplane/v1`` (do not edit).

Regenerate with ``make proto`` (``scripts/gen_proto.py``).
"""
