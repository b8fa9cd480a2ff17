"""``python -m cli serve ...``: the ``quicksilver`` command from a checkout."""

import sys

from cli.main import main

sys.exit(main())
