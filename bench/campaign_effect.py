"""Add the fault runs' effect on the job (``bench/campaign/effect.py``) to
result files of ``bench/campaign_general.py`` written before the campaign
measured it: each fault run is simulated again (the simulator is
deterministic per seed; no analysis) beside its healthy twin. Usage::

    python bench/campaign_effect.py bench/results/campaign_general_*.json --workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.campaign.effect import iterations, mark, twins  # noqa: E402
from bench.campaign_general import SETTINGS, summary  # noqa: E402


def main() -> int:
    """Add ``iterations``, ``iterations_lost`` and ``effect`` to the fault
    rows of result files, and the effective accuracy to their halves."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    by_name = {s.name: s for s in SETTINGS}
    for path in args.files:
        doc = json.loads(path.read_text())
        rows = [r for r in doc["rows"] if r["fault"] != "healthy"]
        jobs = [
            (s, r["seed"] - s.seed_base, r["duration_s"], r["fault"])
            for r in rows
            for s in (by_name[r["setting"]],)
        ]
        with ProcessPoolExecutor(args.workers) as ex:
            for r, n in zip(rows, ex.map(iterations, jobs), strict=True):
                r["iterations"] = n
            twin = twins(ex, [(s, seed, d) for s, seed, d, _ in jobs])
        mark(rows, twin)
        doc["halves"] = {
            h: summary([r for r in doc["rows"] if r["half"] == h])
            for h in doc["halves"]
        }
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(
            path,
            {
                h: {k: v for k, v in s.items() if "effect" in k}
                for h, s in doc["halves"].items()
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
