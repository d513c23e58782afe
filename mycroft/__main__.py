"""``python -m mycroft``."""

import sys

from mycroft.cli import main

sys.exit(main())
