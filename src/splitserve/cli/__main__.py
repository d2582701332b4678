"""`python -m splitserve.cli`: the `splitserve` command."""

import sys

from . import main

sys.exit(main())
