"""Pure admission checks: each takes plain inputs and returns a list of problems.

No check does network I/O; the ones that read files (``files``, ``safetensors``,
``finite``, ``signature``) read only the quarantined copy, with bounds on every
read. :mod:`loraplane.admission.pipeline` runs them all and collects every
problem into a :class:`~loraplane.admission.problems.Verdict`.
"""
