"""``python -m loraplane.native [build [--force] [--quiet] | status]`` (see the package docstring)."""

import sys

from loraplane.native import main

sys.exit(main())
