"""``python -m batchserve``: the same as the ``batchserve`` command."""

import sys

from batchserve.cli import main

sys.exit(main())
