"""Mycroft's Flight Recorder import next to PyTorch's ``fr_trace`` on the same dumps.

For each fault scenario of ``bench/torch_job.py`` (4 gloo ranks) the dumps are
generated fresh (or taken from ``--dumps DIR/<scenario>/pickle``), then:

* ``fr_trace`` raw, with and without ``--allow-incomplete-ranks``;
* ``fr_trace`` on a copy whose gloo ``pg_config`` was repaired (names and
  member lists written in), with and without ``--allow-incomplete-ranks``;
* ``mycroft.streams.flight_recorder`` (``--world-size 4``).

Each tool's verdict is ``crash``, ``none`` or the set of ranks it names.
Writes ``bench/results/torch_fr_compare.json``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mycroft.streams import flight_recorder as fr  # noqa: E402
from tests.unit.torch import harness  # noqa: E402

SCENARIOS = ("stall", "straggler", "crash", "mismatch", "order")


def repair(src: Path, dst: Path, dumps: fr.FrDumps) -> None:
    """Copy ``src`` with a valid ``pg_config`` (what gloo should have written)."""
    dst.mkdir(parents=True, exist_ok=True)
    config = {
        pg: {"name": pg, "desc": dumps.roles.get(pg, ""), "ranks": str(list(m))}
        for pg, m in dumps.groups.items()
    }
    for f in src.iterdir():
        doc = pickle.loads(f.read_bytes())  # noqa: S301 - our own fresh dumps
        doc["pg_config"] = config
        (dst / f.name).write_bytes(pickle.dumps(doc))


def fr_trace(folder: Path, incomplete: bool) -> dict[str, Any]:
    """Run PyTorch's analyzer; classify what it names."""
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
    cmd += [str(folder), "-p", "rank_"]
    if incomplete:
        cmd.append("--allow-incomplete-ranks")
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    if "Traceback" in out:
        last = [ln for ln in out.strip().splitlines() if ln.strip()][-1]
        return {"verdict": "crash", "ranks": [], "says": last[:200]}
    ranks: set[int] = set()
    for m in re.finditer(r"missing ranks: \{([\d, ]+)\}", out):
        ranks |= {int(x) for x in m.group(1).split(",")}
    ranks |= {int(m.group(1)) for m in re.finditer(r"Culprit rank (\d+)", out)}
    said = [ln.strip() for ln in out.splitlines() if ln.strip()]
    key = [
        ln for ln in said if re.search(r"Culprit|missing ranks|Missing|Error|error", ln)
    ]
    return {
        "verdict": "set" if ranks else "none",
        "ranks": sorted(ranks),
        "says": (key or said or ["(no output)"])[0][:200],
    }


def mycroft(folder: Path) -> dict[str, Any]:
    """Mycroft's verdict: the best culprit of the first incident."""
    try:
        doc = fr.analyze(fr.load_dir(folder, world_size=4))
    except Exception as exc:  # noqa: BLE001 - a crash is a verdict here
        return {"verdict": "crash", "ranks": [], "says": repr(exc)[:200]}
    best = [r for r in doc["root_causes"] if r["best"]]
    if not best:
        return {
            "verdict": "none",
            "ranks": [],
            "says": str(doc["flight_recorder"]["blocked"])[:200],
        }
    b = best[0]
    return {
        "verdict": "single" if len({r["rank"] for r in best}) == 1 else "set",
        "ranks": sorted({r["rank"] for r in best}),
        "component": b["component"],
        "kind": b["kind"],
        "says": b["reason"][:200],
    }


def compare(scenario: str, pickles: Path, work: Path) -> dict[str, Any]:
    """Every tool on one scenario's dumps."""
    dumps = fr.load_dir(pickles, world_size=4)
    fixed = work / f"{scenario}-fixed"
    repair(pickles, fixed, dumps)
    rank, component, kind = harness.FR_EXPECTED[scenario]
    return {
        "expected": {"rank": rank, "component": component, "kind": kind},
        "dumps": sorted(dumps.entries),
        "fr_trace_raw": fr_trace(pickles, False),
        "fr_trace_raw_incomplete": fr_trace(pickles, True),
        "fr_trace_fixed": fr_trace(fixed, False),
        "fr_trace_fixed_incomplete": fr_trace(fixed, True),
        "mycroft": mycroft(pickles),
        "mycroft_json_dumps": mycroft(pickles.parent / "json"),
    }


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) dumps, compare, write the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dumps", type=Path, help="reuse DIR/<scenario>/pickle")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/torch_fr_compare.json"
    )
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for s in args.scenarios:
            if args.dumps:
                pickles = args.dumps / s / "pickle"
            else:
                pickles = harness.generate_dumps(s, work / s)
            results[s] = compare(s, pickles, work)
            print(
                s,
                json.dumps(
                    {
                        k: v.get("ranks", v) if isinstance(v, dict) else v
                        for k, v in results[s].items()
                    }
                ),
            )
            if not args.dumps:
                shutil.rmtree(work / s, ignore_errors=True)
    doc = {
        "setup": "4 gloo ranks on one 2-core machine, torch 2.13.0; dumps by an "
        "in-process watchdog (_dump_fr_trace without stacks, 3 s without "
        "progress, on error, at exit); verdicts: crash, none, set/single + ranks",
        "dumps": str(args.dumps) if args.dumps else "generated fresh",
        "scenarios": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
