"""``python -m mmptm.cli``: the command line (how torchrun starts it)."""

import sys

from mmptm.cli import main

sys.exit(main())
