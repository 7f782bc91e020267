"""``python -m benchmarks.fuzz``: see :mod:`benchmarks.fuzz`."""

import sys

from .cli import main

sys.exit(main())
