"""Checks what one run of the GPU check left; standard library only (``gpu_check.sh``).

    python3 gpu_ring_check.py RUN_DIR [--baseline OFF_DIR] [--json OUT]

``RUN_DIR`` is a run of the job with the plugin loaded: ``rings/*.ring``, one
``manifest-R.json`` per rank (the ops the rank issued per communicator, its
pid and AllReduce times; written by ``gpu_nccl_job.c`` or ``gpu_torch_job.py``)
and one NCCL_DEBUG=INFO log ``rank-R.log`` per rank. ``OFF_DIR`` is the same
run with ``NCCL_PROFILER_PLUGIN=none``: it must leave no ring, and its times
give the plugin's overhead. Exit 0 when every check passes, 1 otherwise.

The ring decoder follows ``schemas/ring.md`` (layout versions 3 and 4) and
imports nothing from the repository, so a bare ``python3`` (3.8+) runs it.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OP_NAMES = (
    "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send",
    "Recv", "AllToAll", "Barrier", "Gather", "Scatter",
)  # fmt: skip
"""``schemas/vocab.py`` OP_NAMES: OP_ISSUED ``kind`` codes."""
P2P = {"Send", "Recv"}
MAGIC = b"MYCRING1"
HEADER = struct.Struct("<8sIIIIiiqi")
SLOT_HEAD = struct.Struct("<QBBHIq")
WRITE_IDX = struct.Struct("<Q")
LAYOUTS = {  # kind: (name, payload struct from byte 24, fields); ring.md §4-§4c
    1: ("COMM", "<Qiiii", "comm nranks comm_rank nchannels gpu"),
    2: ("OP_ISSUED", "<QqqBBBxiB3xI",
        "comm seq nbytes kind algo proto nflows dtype func_seq"),
    3: ("FLOW_PROGRESS", "<QqhBxiiiii",
        "comm seq channel direction peer total gpu_ready transmitted done"),
    4: ("FLOW_DONE", "<QqqhBxiiI",
        "comm seq first_ns channel direction peer chunks wire_us"),
    5: ("OP_DONE", "<Qqqi", "comm seq start_ns nflows"),
    6: ("BEAT", "<qIIIIIII", "step dropped_comms dropped_ops dropped_flows "
        "pxn_flows unseen_ops abandoned_ops orphan_flows"),
    7: ("COMM_RANKS", "<Qii6i", "comm nranks first r0 r1 r2 r3 r4 r5"),
    8: ("COMM_NAME", "<Q32s", "comm name"),
    9: ("FLOW_STEPS", "<QqhBxiiiq",
        "comm seq channel direction peer posted received nbytes"),
}  # fmt: skip
PARSERS = {k: (n, struct.Struct(s), f.split()) for k, (n, s, f) in LAYOUTS.items()}
SHOWN = 12
"""Problems listed per check (the rest are counted)."""


@dataclass(frozen=True)
class Record:
    """One valid ring record: its number, kind name, time and payload fields."""

    n: int
    kind: str
    ts_ns: int
    f: dict[str, Any]


@dataclass
class Ring:
    """A decoded ring file and what is wrong with its slots."""

    path: Path
    version: int = 0
    pid: int = -1
    rank: int = -1
    job_id: str = ""
    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[Record]:
        """Records of one kind, in ring order."""
        return [r for r in self.records if r.kind == kind]

    def last_beat(self) -> dict[str, Any]:
        """Payload of the newest BEAT (empty when there is none)."""
        beats = self.of("BEAT")
        return beats[-1].f if beats else {}


def slot_crc(slot: bytes) -> int:
    """CRC-32 of the 64 committed slot bytes with the crc field as zero (§5)."""
    return zlib.crc32(slot[:12] + b"\0\0\0\0" + slot[16:64])


def decode_slot(ring: Ring, n: int, slot: bytes) -> None:
    """Append record ``n`` to ``ring`` or say why its slot is not valid (§6)."""
    seq, kind, _flags, _res, crc, ts_ns = SLOT_HEAD.unpack_from(slot)
    if seq != 2 * n + 2:
        torn = "torn (odd sequence word)" if seq & 1 else f"sequence word {seq}"
        ring.problems.append(f"record {n}: {torn}, not {2 * n + 2}")
    elif slot_crc(slot) != crc:
        ring.problems.append(f"record {n}: CRC mismatch")
    elif kind not in PARSERS:
        ring.problems.append(f"record {n}: unknown kind {kind}")
    else:
        name, payload, names = PARSERS[kind]
        values = payload.unpack_from(slot, SLOT_HEAD.size)
        ring.records.append(
            Record(n, name, ts_ns, {k: values[i] for i, k in enumerate(names)})
        )


def read_ring(path: Path) -> Ring:
    """Decode a ring file; slot problems go to ``Ring.problems``."""
    data = path.read_bytes()
    ring = Ring(path)
    if len(data) < 128:
        ring.problems.append("shorter than the 128-byte header")
        return ring
    magic, version, hsize, ssize, nslots, pid, rank, _created, _local = (
        HEADER.unpack_from(data)
    )
    ring.version, ring.pid, ring.rank = version, pid, rank
    ring.job_id = data[80:128].rstrip(b"\0").decode("utf-8", "replace")
    if magic != MAGIC or hsize != 128 or ssize != 64 or nslots < 2:
        ring.problems.append(f"bad header: {magic!r} {hsize}/{ssize}/{nslots}")
        return ring
    if version not in (3, 4):
        ring.problems.append(f"layout version {version}, not 3 or 4")
    if len(data) != 128 + 64 * nslots:
        ring.problems.append(f"{len(data)} bytes, not 128 + 64 x {nslots}")
        return ring
    (written,) = WRITE_IDX.unpack_from(data, 64)
    if written > nslots:
        ring.problems.append(
            f"wrapped: {written - nslots} oldest records overwritten "
            "(raise MYCROFT_NCCL_RING_SLOTS)"
        )
    for n in range(max(0, written - nslots), written):
        k = 128 + 64 * (n % nslots)
        decode_slot(ring, n, data[k : k + 64])
    rest = data[128 + 64 * min(written, nslots) :]  # never written: all zero
    if rest.strip(b"\0"):
        k = written + (len(rest) - len(rest.lstrip(b"\0"))) // 64
        ring.problems.append(f"slot {k} written past write_idx {written} (torn)")
    return ring


@dataclass
class Run:
    """Everything one run left: rings, per-rank manifests and logs, the baseline."""

    rings: list[Ring]
    manifests: dict[int, dict[str, Any]]
    logs: dict[int, str]
    off_manifests: dict[int, dict[str, Any]] = field(default_factory=dict)
    off_logs: dict[int, str] = field(default_factory=dict)
    off_rings: int = 0
    matches: dict[int, Match] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def ring_of(self, rank: int) -> Ring | None:
        """The ring of the rank whose manifest names its pid."""
        pid = self.manifests[rank].get("pid")
        return next((r for r in self.rings if r.pid == pid), None)

    def ranked(self) -> list[tuple[int, Ring]]:
        """``(rank, ring)`` for every rank with a ring."""
        pairs = [(rank, self.ring_of(rank)) for rank in sorted(self.manifests)]
        return [(rank, ring) for rank, ring in pairs if ring is not None]

    @property
    def nccl(self) -> int:
        """NCCL's version code (23007 = 2.30.7), from rank 0's manifest."""
        return int(self.manifests[min(self.manifests)].get("nccl_version", 0))


def load_dir(
    path: Path,
) -> tuple[dict[int, dict[str, Any]], dict[int, str], list[Path]]:
    """Manifests and logs by rank, and the ring paths, of one run directory."""
    manifests: dict[int, dict[str, Any]] = {}
    logs: dict[int, str] = {}
    for m in sorted(path.glob("manifest-*.json")):
        doc = json.loads(m.read_text())
        manifests[int(doc["rank"])] = doc
    for log in sorted(path.glob("rank-*.log")):
        logs[int(log.stem.split("-")[1])] = log.read_text(errors="replace")
    return manifests, logs, sorted((path / "rings").glob("*.ring"))


def version_text(code: int) -> str:
    """``23007`` -> ``2.30.7``."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def ops_by_comm(ring: Ring) -> dict[int, list[Record]]:
    """OP_ISSUED records per communicator id, in ring order."""
    out: dict[int, list[Record]] = defaultdict(list)
    for r in ring.of("OP_ISSUED"):
        out[r.f["comm"]].append(r)
    return out


def kind_of(r: Record) -> str:
    """The op's kind name (``kind?`` for a code outside OP_NAMES)."""
    k = r.f["kind"]
    return OP_NAMES[k] if k < len(OP_NAMES) else f"kind{k}"


def signature(ops: list[Record]) -> Counter[str]:
    """``"Kind bytes"`` -> count, as the manifests write them."""
    return Counter(f"{kind_of(r)} {r.f['nbytes']}" for r in ops)


def diff(want: Counter[str], got: Counter[str]) -> str:
    """What ``got`` lacks and has too many of, against ``want``."""
    short, extra = dict(want - got), dict(got - want)
    return f"missing {short or '{}'}, unexpected {extra or '{}'}"


# ---- matching the rings' communicators to the manifests ----


@dataclass
class Match:
    """A rank's collective communicators matched to the manifest's labels."""

    labels: dict[str, int] = field(default_factory=dict)
    churn: list[int] = field(default_factory=list)
    unmatched: list[int] = field(default_factory=list)
    hidden_broadcasts: int = 0
    problems: list[str] = field(default_factory=list)


def match(ring: Ring, manifest: dict[str, Any]) -> Match:
    """Find each labelled communicator's ops, then the churn's, in one ring.

    NCCL 2.29+ runs a single-root Broadcast as AllGatherV without telling the
    profiler (BEAT ``unseen_ops`` counts them), so a communicator that has
    exactly its ops but the Broadcasts still matches; they are counted.
    """
    coll = {
        c: signature(ops)
        for c, ops in ops_by_comm(ring).items()
        if any(kind_of(r) not in P2P for r in ops)
    }
    out = Match(unmatched=list(coll))
    for label, spec in manifest["comms"].items():
        want = Counter(spec)
        bare = Counter({k: v for k, v in want.items() if not k.startswith("Broadcast")})
        hit = next((c for c in out.unmatched if coll[c] == want), None)
        if hit is None and bare != want:
            hit = next((c for c in out.unmatched if coll[c] == bare), None)
            out.hidden_broadcasts += sum((want - bare).values()) if hit else 0
        if hit is None:
            best = max(
                out.unmatched,
                key=lambda c: sum((coll[c] & want).values()),
                default=None,
            )
            got = coll[best] if best is not None else Counter()
            out.problems.append(
                f"no communicator with the {label} ops: {diff(want, got)}"
            )
            hit = best
        if hit is not None:
            out.labels[label] = hit
            out.unmatched.remove(hit)
    churn = Counter(manifest.get("churn", {}).get("ops", {}))
    out.churn = [c for c in out.unmatched if churn and coll[c] == churn]
    out.unmatched = [c for c in out.unmatched if c not in out.churn]
    for c in out.unmatched:
        out.problems.append(
            f"communicator {c:#x} has ops {dict(coll[c])} the job never issued"
        )
    return out


# ---- checks: each returns its problems (empty: passed) ----


def check_integrity(run: Run) -> list[str]:
    """Every slot valid (sequence word, CRC, kind); nothing torn or overwritten."""
    if not run.rings:
        return ["no ring written"]
    return [f"{r.path.name}: {p}" for r in run.rings for p in r.problems]


def check_rings(run: Run) -> list[str]:
    """One ring per rank, its header carrying the rank; none without the plugin."""
    world = int(run.manifests[min(run.manifests)]["world"])
    bad = (
        []
        if len(run.manifests) == world
        else [f"{len(run.manifests)} manifests, world {world}"]
    )
    if len(run.rings) != world:
        bad.append(f"{len(run.rings)} rings for {world} ranks")
    for rank, m in sorted(run.manifests.items()):
        ring = run.ring_of(rank)
        if ring is None:
            bad.append(f"rank {rank} (pid {m.get('pid')}): no ring")
        elif ring.rank != rank:
            bad.append(f"rank {rank}: its ring's header says rank {ring.rank}")
        elif ring.version >= 4 and ring.job_id != m.get("job_id", ring.job_id):
            bad.append(
                f"rank {rank}: header job_id {ring.job_id!r}, not {m['job_id']!r}"
            )
    pids = {m.get("pid") for m in run.manifests.values()}
    bad += [
        f"{r.path.name}: pid {r.pid} is no rank's"
        for r in run.rings
        if r.pid not in pids
    ]
    if run.off_rings:
        bad.append(f"the run with NCCL_PROFILER_PLUGIN=none left {run.off_rings} rings")
    return bad


LOADED = re.compile(r"PROFILER/Plugin: Loaded (\S+) \(v(\d+)\)")


def check_loaded(run: Run) -> list[str]:
    """NCCL logged loading Mycroft with the ABI its version looks for, and no error."""
    want = 6 if run.nccl >= 22900 else 5 if run.nccl >= 22800 else 4
    bad = []
    for rank in sorted(run.manifests):
        log = run.logs.get(rank)
        hit = LOADED.search(log or "")
        if log is None:
            bad.append(f"rank {rank}: no log")
        elif not hit:
            bad.append(f"rank {rank}: NCCL did not log 'PROFILER/Plugin: Loaded'")
        elif (hit.group(1), int(hit.group(2))) != ("Mycroft", want):
            bad.append(
                f"rank {rank}: loaded {hit.group(1)} (v{hit.group(2)}), "
                f"not Mycroft (v{want})"
            )
        for line in (log or "").splitlines():
            if "Mycroft profiler" in line or "Profiler init failed" in line:
                bad.append(f"rank {rank}: {line.strip()}")
    for rank, log in sorted(run.off_logs.items()):
        if LOADED.search(log):
            bad.append(f"rank {rank}: a profiler was loaded in the run without it")
    return bad


def check_identity(run: Run) -> list[str]:
    """Every OP_ISSUED (comm, seq) once per ring (graph replays included)."""
    bad = []
    for rank, ring in run.ranked():
        by_key = defaultdict(list)
        for r in ring.of("OP_ISSUED"):
            by_key[(r.f["comm"], r.f["seq"])].append(r)
        for (comm, seq), ops in by_key.items():
            if len(ops) > 1:
                what = ", ".join(sorted(set(signature(ops).elements())))
                bad.append(
                    f"rank {rank}: comm {comm:#x} seq {seq} issued {len(ops)} "
                    f"times ({what})"
                )
    return bad


def done_problems(ring: Ring) -> list[str]:
    """What is wrong with one ring's OP_DONEs (``check_done``)."""
    bad = []
    issued: Counter[tuple[int, int]] = Counter()
    flows: Counter[tuple[int, int]] = Counter()
    done: Counter[tuple[int, int]] = Counter()
    counts = {"OP_ISSUED": issued, "FLOW_DONE": flows, "OP_DONE": done}
    for r in ring.records:
        if r.kind not in counts:
            continue
        key = (r.f["comm"], r.f["seq"])
        counts[r.kind][key] += 1
        if r.kind != "OP_DONE":
            continue
        name = f"comm {key[0]:#x} seq {key[1]}"
        if not issued[key]:
            bad.append(f"{name}: OP_DONE before or without its OP_ISSUED")
        if not r.f["nflows"] == flows[key] > 0:
            bad.append(
                f"{name}: done with nflows {r.f['nflows']} after {flows[key]} "
                "FLOW_DONE (every op here runs on the network transport)"
            )
        flows[key] = 0
    bad += [
        f"comm {k[0]:#x} seq {k[1]}: issued {n}, done {done[k]}"
        for k, n in issued.items()
        if done[k] != n
    ]
    return bad


def check_done(run: Run) -> list[str]:
    """One OP_DONE per op, after its OP_ISSUED and its flows' FLOW_DONEs."""
    return [f"rank {k}: {p}" for k, ring in run.ranked() for p in done_problems(ring)]


def comm_views(
    ring: Ring,
) -> tuple[dict[int, tuple[int, int]], dict[int, list[tuple[int, str]]]]:
    """``{comm: (nranks, comm_rank)}`` from COMM, and ``{comm: [(seq, kind)]}``."""
    members = {r.f["comm"]: (r.f["nranks"], r.f["comm_rank"]) for r in ring.of("COMM")}
    ops = {
        c: [(r.f["seq"], kind_of(r)) for r in rs] for c, rs in ops_by_comm(ring).items()
    }
    return members, ops


def check_cross_rank(run: Run) -> list[str]:
    """A communicator's members agree: positions, op counts, seqs and kinds."""
    views = {rank: comm_views(ring) for rank, ring in run.ranked()}
    bad = []
    for comm in sorted({c for m, _ in views.values() for c in m}):
        held = {rank: v for rank, v in views.items() if comm in v[0]}
        nranks = {v[0][comm][0] for v in held.values()}
        positions = sorted(v[0][comm][1] for v in held.values())
        ops = {rank: sorted(v[1].get(comm, [])) for rank, v in held.items()}
        if len(nranks) != 1 or positions != list(range(next(iter(nranks)))):
            bad.append(
                f"comm {comm:#x}: sizes {sorted(nranks)}, positions {positions} "
                f"in the rings of ranks {sorted(held)}"
            )
        if len({len(o) for o in ops.values()}) > 1:
            counts = {rank: len(o) for rank, o in ops.items()}
            bad.append(f"comm {comm:#x}: ops per rank {counts}")
        elif len({tuple(s for s, k in o) for o in ops.values()}) > 1:
            bad.append(f"comm {comm:#x}: the ranks' seqs differ")
        elif (
            len({tuple((s, k) for s, k in o if k not in P2P) for o in ops.values()}) > 1
        ):
            bad.append(
                f"comm {comm:#x}: one seq names different kinds on different ranks"
            )
    return bad


def check_mix(run: Run) -> list[str]:
    """Every op of the job on its communicator, kind and bytes as issued."""
    bad, hidden, unseen, v4 = [], 0, 0, True
    for rank, ring in run.ranked():
        m = run.matches[rank]
        bad += [f"rank {rank}: {p}" for p in m.problems]
        bad += [
            f"rank {rank}: OP_ISSUED with 0 bytes: comm {r.f['comm']:#x} seq "
            f"{r.f['seq']} {kind_of(r)}"
            for r in ring.of("OP_ISSUED")
            if r.f["nbytes"] <= 0
        ]
        hidden += m.hidden_broadcasts
        unseen += ring.last_beat().get("unseen_ops", 0)
        v4 = v4 and ring.version >= 4
    if hidden and run.nccl < 22900:
        bad.append(f"{hidden} Broadcasts missing on NCCL {version_text(run.nccl)}")
    elif hidden and v4 and unseen != hidden:
        bad.append(f"{hidden} Broadcasts missing, but BEAT unseen_ops is {unseen}")
    elif hidden:
        run.notes.append(
            f"{hidden} Broadcasts (of all ranks) have no profiler event: NCCL "
            f"{version_text(run.nccl)} runs a single-root Broadcast as AllGatherV "
            "without one (NCCL_ALLGATHERV_ENABLE=0 keeps them); BEAT unseen_ops "
            f"{unseen}"
        )
    return bad


def check_p2p(run: Run) -> list[str]:
    """The rank's Send and Recv ops with their bytes (virtual communicators)."""
    bad = []
    for rank, ring in run.ranked():
        got = signature([r for r in ring.of("OP_ISSUED") if kind_of(r) in P2P])
        want = Counter(run.manifests[rank].get("p2p", {}))
        if got != want:
            bad.append(f"rank {rank}: {diff(want, got)}")
    return bad


def done_keys(ring: Ring) -> set[tuple[int, int]]:
    """(comm, seq) of every OP_DONE."""
    return {(r.f["comm"], r.f["seq"]) for r in ring.of("OP_DONE")}


def check_graph(run: Run) -> list[str]:
    """The graph's replays are distinct ops (own seq, own OP_DONE)."""
    bad = []
    for rank, ring in run.ranked():
        m = run.manifests[rank]
        graph = m.get("graph") or {"skipped": "not run"}
        if "skipped" in graph:
            run.notes.append(f"rank {rank}: CUDA graph {graph['skipped']}")
            continue
        name = f"AllReduce {graph['bytes']}"
        want = int(m["comms"]["world"].get(name, 0))
        ops = [
            r for r in ring.of("OP_ISSUED") if f"{kind_of(r)} {r.f['nbytes']}" == name
        ]
        keys = {(r.f["comm"], r.f["seq"]) for r in ops}
        if len(ops) != want or len(keys) != want or not keys <= done_keys(ring):
            bad.append(
                f"rank {rank}: {name}: {want} issued (1 + {graph['replays']} "
                f"replays), {len(ops)} OP_ISSUED, {len(keys)} distinct seqs, "
                f"{len(keys & done_keys(ring))} done"
            )
    return bad


def check_churn(run: Run) -> list[str]:
    """Every churned communicator profiled, and the ops after the churn too."""
    bad = []
    for rank, ring in run.ranked():
        m = run.manifests[rank]
        want = int(m.get("churn", {}).get("count", 0))
        got = len(run.matches[rank].churn)
        beat = ring.last_beat()
        if got != want:
            bad.append(
                f"rank {rank}: {got} of {want} churned communicators profiled "
                f"(BEAT dropped_comms {beat.get('dropped_comms')})"
            )
        sig = signature(ring.of("OP_ISSUED"))
        for name, n in m.get("after_churn", {}).items():
            if sig[name] < n:
                bad.append(f"rank {rank}: after the churn {sig[name]} of {n} {name}")
    return bad


def walk_flows(ring: Ring) -> tuple[list[str], list[str]]:
    """Counter and byte problems of one ring's flows (``(counters, bytes)``)."""
    counters, nbytes = [], []
    progress: dict[tuple[int, ...], dict[str, Any]] = {}
    steps: dict[tuple[int, ...], dict[str, Any]] = {}
    for r in ring.records:
        if r.kind not in ("FLOW_PROGRESS", "FLOW_STEPS", "FLOW_DONE"):
            continue
        key = tuple(r.f[k] for k in ("comm", "seq", "channel", "direction", "peer"))
        name = "comm {:#x} seq {} ch {} dir {} peer {}".format(*key)
        if r.kind == "FLOW_PROGRESS":
            counters += flow_step_problems(name, progress.get(key), r.f)
            progress[key] = r.f
        elif r.kind == "FLOW_STEPS":
            old = steps.get(key)
            if old and (r.f["nbytes"] < old["nbytes"] or r.f["posted"] < old["posted"]):
                counters.append(f"{name}: FLOW_STEPS went back: {old} -> {r.f}")
            steps[key] = r.f
        else:
            p, s = progress.pop(key, None), steps.pop(key, None)
            if p is None or not r.f["chunks"] == p["done"] == p["total"]:
                counters.append(f"{name}: FLOW_DONE chunks {r.f['chunks']}, last {p}")
            if r.ts_ns < r.f["first_ns"]:
                counters.append(f"{name}: FLOW_DONE before its first progress")
            if p and p["done"] and (s is None or s["nbytes"] <= 0):
                nbytes.append(f"{name}: {p['done']} steps done, no bytes")
    counters += [f"comm {k[0]:#x} seq {k[1]} ch {k[2]}: no FLOW_DONE" for k in progress]
    return counters, nbytes


def flow_step_problems(
    name: str, old: dict[str, Any] | None, new: dict[str, Any]
) -> list[str]:
    """What is wrong with one FLOW_PROGRESS after the flow's previous one."""
    g, t, d = new["gpu_ready"], new["transmitted"], new["done"]
    bad = (
        []
        if new["total"] >= g >= t >= d >= 0
        else [f"{name}: not total>=G>=T>=D>=0: {new}"]
    )
    if new["direction"] == 0 and g > t + 1:
        bad.append(f"{name}: send G {g} > T {t} + 1")
    if old and (g < old["gpu_ready"] or t < old["transmitted"] or d < old["done"]):
        bad.append(f"{name}: counters went back: {old} -> {new}")
    return bad


def check_flows(run: Run) -> list[str]:
    """Per flow: total >= G >= T >= D, none decreasing, send G <= T + 1, all done."""
    return [f"rank {k}: {p}" for k, ring in run.ranked() for p in walk_flows(ring)[0]]


def check_bytes(run: Run) -> list[str]:
    """Every flow that finished steps moved bytes (NCCL's transSize, FLOW_STEPS)."""
    return [f"rank {k}: {p}" for k, ring in run.ranked() for p in walk_flows(ring)[1]]


def check_drops(run: Run) -> list[str]:
    """BEATs present; nothing dropped, abandoned or orphaned (layout 4 counters)."""
    bad = []
    keys = (
        "dropped_comms",
        "dropped_ops",
        "dropped_flows",
        "abandoned_ops",
        "orphan_flows",
    )
    for rank, ring in run.ranked():
        beat = ring.last_beat()
        if not beat:
            bad.append(f"rank {rank}: no BEAT")
        lost = {k: beat[k] for k in keys if beat.get(k)}
        if lost:
            bad.append(f"rank {rank}: last BEAT {lost}")
    return bad


WITHOUT_RINGS = {"ring integrity", "one ring per rank", "plugin loaded"}
"""Checks that do not need every rank's ring (the others fail without one)."""
CHECKS = (
    ("ring integrity", check_integrity),
    ("one ring per rank", check_rings),
    ("plugin loaded", check_loaded),
    ("op identity", check_identity),
    ("every op done", check_done),
    ("ranks agree", check_cross_rank),
    ("op mix", check_mix),
    ("send/recv", check_p2p),
    ("graph replays", check_graph),
    ("communicator churn", check_churn),
    ("flow counters", check_flows),
    ("bytes", check_bytes),
    ("no drops", check_drops),
)


def overhead(run: Run) -> dict[str, Any]:
    """AllReduce time with over without the plugin per size, mean of the ranks."""
    out = {}
    for size in sorted(
        {s for m in run.manifests.values() for s in m.get("timing_us", {})}, key=int
    ):
        on = [
            m["timing_us"][size]
            for m in run.manifests.values()
            if size in m.get("timing_us", {})
        ]
        off = [
            m["timing_us"][size]
            for m in run.off_manifests.values()
            if size in m.get("timing_us", {})
        ]
        if on and off and min(off) > 0:
            mean_on, mean_off = sum(on) / len(on), sum(off) / len(off)
            out[size] = {
                "off_us": round(mean_off, 2),
                "on_us": round(mean_on, 2),
                "ratio": round(mean_on / mean_off, 4),
            }
    if out:
        ratios = [v["ratio"] for v in out.values()]
        out["mean_ratio"] = round(sum(ratios) / len(ratios), 4)
    return out


def ring_summary(rank: int, ring: Ring) -> dict[str, Any]:
    """What the report shows of one ring."""
    kinds = Counter(r.kind for r in ring.records)
    return {
        "rank": rank,
        "file": ring.path.name,
        "job_id": ring.job_id,
        "version": ring.version,
        "pid": ring.pid,
        "header_rank": ring.rank,
        "records": len(ring.records),
        "kinds": dict(kinds),
        "last_beat": ring.last_beat(),
    }


def evaluate(run: Run) -> dict[str, Any]:
    """Run every check; the results document."""
    run.matches = {
        rank: match(ring, run.manifests[rank]) for rank, ring in run.ranked()
    }
    no_ring = [
        f"rank {k}: no ring" for k in sorted(run.manifests) if not run.ring_of(k)
    ]
    checks = []
    for name, fn in CHECKS:
        bad = fn(run) + ([] if name in WITHOUT_RINGS else no_ring)
        checks.append({"name": name, "ok": not bad, "doc": fn.__doc__, "problems": bad})
    first = run.manifests[min(run.manifests)]
    return {
        "ok": all(c["ok"] for c in checks),
        "nccl": version_text(run.nccl),
        "job": first.get("job"),
        "world": first.get("world"),
        "checks": checks,
        "notes": run.notes,
        "rings": [ring_summary(rank, ring) for rank, ring in run.ranked()],
        "overhead": overhead(run),
        "wall_s": {
            "on": [m.get("wall_s") for _, m in sorted(run.manifests.items())],
            "off": [m.get("wall_s") for _, m in sorted(run.off_manifests.items())],
        },
    }


def report(doc: dict[str, Any]) -> str:
    """The human summary of a results document."""
    lines = [
        f"gpu_ring_check: NCCL {doc['nccl']}, job {doc['job']}, {doc['world']} ranks"
    ]
    for r in doc["rings"]:
        lines.append(
            f"  rank {r['rank']}: {r['file']}, layout {r['version']}, "
            f"{r['records']} records {r['kinds']}"
        )
    for c in doc["checks"]:
        lines.append(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']}")
        lines += [f"       {p}" for p in c["problems"][:SHOWN]]
        if len(c["problems"]) > SHOWN:
            lines.append(f"       ... and {len(c['problems']) - SHOWN} more")
    lines += [f"  note: {n}" for n in doc["notes"]]
    over = doc["overhead"]
    for size, v in over.items():
        if size != "mean_ratio":
            lines.append(
                f"  AllReduce {int(size):>8} B: {v['off_us']:9.1f} us without, "
                f"{v['on_us']:9.1f} us with the plugin (x{v['ratio']:.3f})"
            )
    if over:
        lines.append(f"  overhead: mean ratio with/without x{over['mean_ratio']:.3f}")
    failed = sum(not c["ok"] for c in doc["checks"])
    verdict = "OK" if doc["ok"] else f"FAILED ({failed} of {len(doc['checks'])} checks)"
    lines.append(f"gpu_ring_check: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Check RUN_DIR (and OFF_DIR); print the summary; write the JSON document."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--baseline", type=Path, help="the run without the plugin")
    ap.add_argument("--json", type=Path, help="write the results document here")
    args = ap.parse_args(argv)
    manifests, logs, rings = load_dir(args.run_dir)
    if not manifests:
        doc = {"ok": False, "reason": f"no manifest-*.json in {args.run_dir}"}
        print(f"gpu_ring_check: {doc['reason']}: the job did not finish")
        if args.json:
            args.json.write_text(json.dumps(doc) + "\n")
        return 1
    run = Run([read_ring(p) for p in rings], manifests, logs)
    if args.baseline:
        run.off_manifests, run.off_logs, off_rings = load_dir(args.baseline)
        run.off_rings = len(off_rings)
    doc = evaluate(run)
    print(report(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
