"""`python -m container_entry ...` is the same as the `container-entry` console script."""

import sys

from container_entry.cli import console_main

sys.exit(console_main())
