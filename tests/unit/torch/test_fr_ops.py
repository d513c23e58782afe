"""Flight Recorder op names, coalesced ops and cross-rank checks, on small
dumps written the way torch 2.13 writes them (``version`` 2.10 entries)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mycroft.producers.torch.frops import TORCH_OPS, UNKNOWN_KIND, op_kind, op_name
from mycroft.schemas.columns import dtype_of
from mycroft.schemas.records import StateBatch
from mycroft.schemas.vocab import OP_NAMES
from mycroft.streams import flight_recorder as fr
from tests.unit.torch.frdumps import entry, healthy, write


def test_every_torch_op_name_has_a_mycroft_kind() -> None:
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    for name in types.COLLECTIVES | types.P2P | {"coalesced"}:
        assert op_kind(name) < len(OP_NAMES), name
    assert OP_NAMES[TORCH_OPS["_broadcast_oop"]] == "broadcast"
    assert OP_NAMES[TORCH_OPS["reduce_scatter_tensor_coalesced"]] == "reducescatter"
    assert op_kind("frobnicate") == UNKNOWN_KIND
    assert op_name("nccl:send 0->1") == "send" and op_name("gloo:barrier") == "barrier"


def op_rows(folder: Path) -> set[tuple[int, int]]:
    """(rank, kind) of every op row the core is handed."""
    out = set()
    for _ts, rec in fr.to_records(fr.load_dir(folder)):
        if isinstance(rec, StateBatch):
            assert rec.op.dtype == dtype_of(fr.OP_COLUMNS)
            out |= {(int(o["rank"]), int(o["kind"])) for o in rec.op}
    return out


def test_hang_in_an_op_outside_the_old_list_is_seen(tmp_path: Path) -> None:
    for r in range(4):
        rows = healthy(20, r)
        if r != 2:
            rows.append(
                entry(21, 1050, "_broadcast_oop", retired=False, state="started")
            )
        write(tmp_path, r, rows)
    doc = fr.analyze(fr.load_dir(tmp_path))
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (2, "hang", "host")
    assert (0, OP_NAMES.index("broadcast")) in op_rows(tmp_path)
    assert doc["flight_recorder"]["unknown_ops"] == {}


def test_unknown_op_names_are_counted_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for r in range(4):
        rows = healthy(20, r)
        rows += [entry(21, 1050, "frobnicate"), entry(22, 1100, "all_reduce")]
        write(tmp_path, r, rows[:-1] if r == 3 else rows)
    d = fr.load_dir(tmp_path)
    assert d.unknown_ops == {"frobnicate": 4}
    assert [e.op for e in d.entries[0]][-2:] == ["frobnicate", "all_reduce"]
    doc = fr.analyze(d)
    assert doc["flight_recorder"]["unknown_ops"] == {"frobnicate": 4}
    assert UNKNOWN_KIND not in {k for _r, k in op_rows(tmp_path)}
    fr.main([str(tmp_path)])
    assert "4 records with unknown op names: frobnicate (4)" in capsys.readouterr().out


def coalesced(seq: int, t_ms: float, out: int = 8) -> list[dict[str, Any]]:
    """Three rows of one coalesced all-gather, one ``collective_seq_id``."""
    name = "all_gather_into_tensor_coalesced"
    return [
        entry(seq, t_ms, name, input_sizes=[[2]], output_sizes=[[out]]),
        entry(seq, t_ms, name, input_sizes=[[3]], output_sizes=[[12]]),
        entry(seq, t_ms, name, input_sizes=[[4]], output_sizes=[[16]]),
    ]


def test_coalesced_rows_are_one_op_with_every_row(tmp_path: Path) -> None:
    for r in range(4):
        write(tmp_path, r, [*healthy(5, r), *coalesced(6, 300)])
    d = fr.load_dir(tmp_path)
    last = d.entries[1][-1]
    assert (last.seq, last.rows, last.nbytes) == (5, 3, (2 + 3 + 4) * 4)
    assert last.sizes == "[[2]] [[3]] [[4]]"
    doc = fr.analyze(d)
    assert doc["flight_recorder"]["mismatches"] == []
    assert doc["root_causes"] == []


def test_out_of_place_output_size_mismatch_names_the_odd_rank(tmp_path: Path) -> None:
    """Same inputs everywhere, rank 1's output of one coalesced row differs:
    the bytes the core compares agree, the output sizes do not."""
    for r in range(4):
        write(tmp_path, r, [*healthy(5, r), *coalesced(6, 300, out=4 if r == 1 else 8)])
    doc = fr.analyze(fr.load_dir(tmp_path))
    odd = doc["flight_recorder"]["mismatches"]
    assert [(m["field"], m["ranks"]) for m in odd] == [("output_sizes", [1])]
    best = doc["root_causes"][0]
    assert (best["rank"], best["kind"], best["component"]) == (1, "mismatch", "config")


def test_dtype_mismatch_is_reported(tmp_path: Path) -> None:
    for r in range(4):
        dt = ["BFloat16"] if r == 2 else ["Float"]
        write(tmp_path, r, [*healthy(5, r), entry(6, 300, output_dtypes=dt)])
    odd = fr.analyze(fr.load_dir(tmp_path))["flight_recorder"]["mismatches"]
    assert [(m["field"], m["ranks"]) for m in odd] == [("dtypes", [2])]


def test_scatter_inputs_may_differ(tmp_path: Path) -> None:
    for r in range(4):
        sizes = [[32]] if r == 0 else []
        write(
            tmp_path, r, [*healthy(5, r), entry(6, 300, "scatter", input_sizes=sizes)]
        )
    assert fr.analyze(fr.load_dir(tmp_path))["flight_recorder"]["mismatches"] == []


def test_state_is_compared_across_ranks_of_a_blocked_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for r in range(4):
        state = "scheduled" if r == 3 else "started"
        rows = [*healthy(20, r), entry(21, 1050, retired=False, state=state)]
        write(tmp_path, r, rows)
    blocked = fr.analyze(fr.load_dir(tmp_path))["flight_recorder"]["blocked"]
    assert blocked[0]["states"] == {"scheduled": [3], "started": [0, 1, 2]}
    fr.main([str(tmp_path)])
    said = capsys.readouterr().out
    assert "states {'scheduled': [3], 'started': [0, 1, 2]}" in said


def test_p2p_entries_are_kept_apart_and_counted(tmp_path: Path) -> None:
    for r in range(2):
        peer = f"send {r}->{1 - r}" if r == 0 else f"recv {r}<-{1 - r}"
        p2p = entry(0, 320, is_p2p=True, collective_seq_id=5, p2p_seq_id=1)
        write(tmp_path, r, [*healthy(5, r), p2p | {"profiling_name": f"nccl:{peer}"}])
    d = fr.load_dir(tmp_path)
    assert [(e.op, e.peer) for e in d.p2p[0]] == [("send", 1)]
    assert [(e.op, e.peer) for e in d.p2p[1]] == [("recv", 0)]
    assert fr.analyze(d)["flight_recorder"]["p2p_records"] == 2


def test_uneven_all_to_all_splits_are_no_mismatch(tmp_path: Path) -> None:
    for r in range(4):
        sizes = {"input_sizes": [[8 + r]], "output_sizes": [[11 - r]]}
        op = entry(6, 300, "all_to_all_single", **sizes)
        write(tmp_path, r, [*healthy(5, r), op])
    assert fr.fr_checks.mismatches(fr.load_dir(tmp_path)) == []
