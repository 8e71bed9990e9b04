"""`python -m conveyor.cli`: the `conveyor` command without its console script."""

import sys

from conveyor.cli import main

sys.exit(main())
