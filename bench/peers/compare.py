"""batchserve beside the servers a user would pick instead: the entry point of the comparison.

The program is the package ``bench/peers/comparison/`` (its docstring says what it runs and
how, module by module); this script only runs its command line, from the repository root:

``python bench/peers/compare.py [--quick] [--scenarios ...] [--servers ...]``: the scenarios;
``python bench/peers/compare.py report RAW [RESULTS]``: the report rebuilt from a run's raw
figures; ``python bench/peers/compare.py servers [SERVER ...]``: each server started,
probed and stopped by hand. ``--help`` lists the flags.
"""

from __future__ import annotations

import sys

from comparison.cli import main

if __name__ == "__main__":
    sys.exit(main())
