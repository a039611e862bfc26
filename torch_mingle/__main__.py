"""``python -m torch_mingle doctor|ls``."""

import sys

from torch_mingle.cli import main

sys.exit(main())
