"""Fault campaign: run, score and report simulated incidents.

A campaign measures the checkout it sits in. An editable install maps the
``mycroft`` packages to the checkout it was made from, so a campaign started
from another clone would silently measure that one: importing this package
refuses it.
"""

from pathlib import Path

import mycroft.streams

_HERE = Path(__file__).resolve().parents[2]
_USED = Path(mycroft.streams.__file__).resolve().parents[1]
if (_USED / "bench").is_dir() and _USED != _HERE:
    raise SystemExit(
        f"bench in {_HERE} would measure the mycroft code of {_USED} (the "
        "checkout this environment was installed from): run it from that "
        f"checkout, or install this one (cd {_HERE} && ./dev setup)"
    )
