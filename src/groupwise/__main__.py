"""`python -m groupwise`: the `groupwise` command, for a venv whose scripts are not on PATH."""

import sys

from groupwise.cli import main

sys.exit(main())
