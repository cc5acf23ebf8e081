"""``python -m asyncrt``: the command line (:mod:`asyncrt.cli`)."""

import sys

from .cli import main

sys.exit(main())
