"""``python -m pulse_node`` is ``pulse-node``."""

import sys

from pulse_node.cli import main

sys.exit(main())
