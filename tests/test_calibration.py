"""Calibration profiles: nccl-tests and GEMM CSV parsers, YAML round trip, error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsim.calibration import (
    Calibration,
    CollectivePoint,
    GemmPoint,
    build_calibration,
    bus_factor,
    load_calibration,
    parse_gemm_csv,
    parse_nccl_tests,
    save_calibration,
)
from llmsim.errors import UserError

DATA = Path(__file__).parent / "data"
ALL_REDUCE = DATA / "nccl_all_reduce_8xa100.txt"
REDUCE_SCATTER = DATA / "nccl_reduce_scatter_2x8xa100.txt"
GEMM = DATA / "gemm_a100.csv"


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 16) == pytest.approx(15 / 16)
    assert bus_factor("send_recv", 2) == 1.0


def test_all_reduce_output_gives_one_point_per_row() -> None:
    points = parse_nccl_tests(ALL_REDUCE)
    assert len(points) == 16
    assert {(p.collective, p.ranks, p.nodes) for p in points} == {("all_reduce", 8, 1)}
    assert [p.bytes for p in points] == [8 * 4**i for i in range(16)]
    assert points[-1].busbw_gbps == 231.92  # out-of-place busbw column, not in-place 230.54
    assert points[9].busbw_gbps == 97.04


def test_busbw_below_print_resolution_comes_from_the_time_column() -> None:
    first = parse_nccl_tests(ALL_REDUCE)[0]  # "8 ... 22.00 0.00 0.00"
    assert first.busbw_gbps == pytest.approx(8 / 22.00e-6 * 1.75 / 1e9)


def test_older_format_with_binary_on_the_command_line() -> None:
    points = parse_nccl_tests(REDUCE_SCATTER)
    assert len(points) == 6
    assert {(p.collective, p.ranks, p.nodes) for p in points} == {("reduce_scatter", 16, 2)}
    assert points[0].busbw_gbps == 19.54


def test_srun_labels_and_several_runs_in_one_file(tmp_path: Path) -> None:
    labelled = "".join(f"0: {line}\n" for line in ALL_REDUCE.read_text().splitlines())
    path = tmp_path / "two_runs.txt"
    path.write_text(labelled + REDUCE_SCATTER.read_text())
    points = parse_nccl_tests(path)
    kinds = {(p.collective, p.ranks, p.nodes) for p in points}
    assert kinds == {("all_reduce", 8, 1), ("reduce_scatter", 16, 2)}
    assert len(points) == 22


def test_sendrecv_binary_maps_to_send_recv(tmp_path: Path) -> None:
    text = ALL_REDUCE.read_text().replace("all_reduce_perf", "sendrecv_perf")
    (tmp_path / "sr.txt").write_text(text)
    assert {p.collective for p in parse_nccl_tests(tmp_path / "sr.txt")} == {"send_recv"}


def test_gemm_csv() -> None:
    points = parse_gemm_csv(GEMM)
    assert len(points) == 12
    assert points[0] == GemmPoint(m=256, n=256, k=256, dtype="bf16", tflops=14.2)
    assert {p.dtype for p in points} == {"bf16", "fp16", "tf32"}


def test_gemm_csv_columns_in_any_order_extra_ignored(tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    path.write_text("dtype, K, M, N, time_us, TFLOPS\n\nBF16, 64, 32, 16, 1.5, 0.25\n")
    assert parse_gemm_csv(path) == [GemmPoint(m=32, n=16, k=64, dtype="bf16", tflops=0.25)]


@pytest.mark.parametrize(
    ("name", "where", "words"),
    [
        ("gemm_bad_value.csv", "gemm_bad_value.csv:3:", "'fast'"),
        ("gemm_bad_dtype.csv", "gemm_bad_dtype.csv:2:", "dtype"),
        ("gemm_missing_column.csv", "gemm_missing_column.csv:2:", "lacks column(s) tflops"),
        ("gemm_wrong_count.csv", "gemm_wrong_count.csv:3:", "4 values for 5 columns"),
        ("nccl_bad_row.txt", "nccl_bad_row.txt:27:", "'9.9x'"),
        ("nccl_no_ranks.txt", "nccl_no_ranks.txt:12:", "Rank"),
        ("nccl_alltoall.txt", "nccl_alltoall.txt:4:", "alltoall_perf is not supported"),
        ("nccl_no_collective.txt", "nccl_no_collective.txt:19:", "which collective"),
        ("nccl_no_rows.txt", "nccl_no_rows.txt:", "no result rows"),
    ],
)
def test_broken_files_name_file_and_line(name: str, where: str, words: str) -> None:
    path = DATA / "broken" / name
    parse = parse_gemm_csv if name.endswith(".csv") else parse_nccl_tests
    with pytest.raises(UserError) as err:
        parse(path)
    assert str(err.value).startswith(where)
    assert words in str(err.value)


def test_truncated_row(tmp_path: Path) -> None:
    lines = ALL_REDUCE.read_text().splitlines()
    lines[20] = "        2048           512     float"
    path = tmp_path / "cut.txt"
    path.write_text("\n".join(lines))
    with pytest.raises(UserError, match=r"^cut\.txt:21: row has 3 fields"):
        parse_nccl_tests(path)


def test_missing_files_are_user_errors(tmp_path: Path) -> None:
    for parse in (parse_gemm_csv, parse_nccl_tests, load_calibration):
        with pytest.raises(UserError, match="cannot read"):
            parse(tmp_path / "nope")


def test_profile_round_trip(tmp_path: Path) -> None:
    cal = build_calibration([GEMM], [ALL_REDUCE, REDUCE_SCATTER], source="DGX A100, example")
    assert len(cal.gemm) == 12 and len(cal.collectives) == 22
    path = tmp_path / "profile.yaml"
    save_calibration(cal, path)
    assert load_calibration(path) == cal
    assert "- {m: 256, n: 256, k: 256, dtype: bf16, tflops: 14.2}" in path.read_text()


def test_profile_validation_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("source: x\ngemm:\n  - {m: 1, n: 1, k: 1, dtype: bf16, tflops: 3, tflop: 3}\n")
    with pytest.raises(UserError, match=r"unknown field 'gemm\[0\]\.tflop'"):
        load_calibration(path)
    path.write_text(
        "collectives:\n  - {collective: all_reduce, ranks: 0, nodes: 1, bytes: 8, busbw_gbps: 1}\n"
    )
    with pytest.raises(UserError, match=r"collectives\[0\]\.ranks"):
        load_calibration(path)
    path.write_text("gemm: [\n")
    with pytest.raises(UserError, match=r"p\.yaml: line"):
        load_calibration(path)


def test_specs_are_frozen() -> None:
    point = CollectivePoint(collective="all_reduce", ranks=8, nodes=1, bytes=8, busbw_gbps=1.0)
    with pytest.raises(ValueError):
        point.ranks = 4  # type: ignore[misc]
    assert Calibration().gemm == []


@pytest.mark.parametrize("overrides", [
    {},
    {"parallelism.sequence_parallel": True, "parallelism.overlap_tp_comm": True},
])
def test_gemm_shapes_account_for_every_gemm_flop(overrides: dict[str, object]) -> None:
    from helpers import make_scenario

    from llmsim.calibration import SHAPE_COLUMNS, gemm_shapes
    from llmsim.ops import ComputeOp
    from llmsim.workload import build_workload

    overrides = {"training.seq_len": 256, **overrides}  # 256 tokens per micro-batch, h 512
    scenario = make_scenario(**{k.replace(".", "__"): v for k, v in overrides.items()})
    wl = build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    shapes = gemm_shapes([(wl, scenario.training.precision)])
    assert tuple(shapes.columns) == SHAPE_COLUMNS
    gemm_flops = sum(op.flops for c in wl.chunks.values()
                     for op in c.ops
                     if isinstance(op, ComputeOp) and op.kind == "gemm") * wl.microbatches
    listed = (shapes["calls_per_step"] * shapes["gflop_per_call"]).sum() * 1e9
    assert listed == pytest.approx(gemm_flops, rel=1e-9)
    assert shapes["flop_share_pct"].sum() == pytest.approx(100)
    assert shapes["flop_share_pct"].is_monotonic_decreasing
    # The QKV GEMM (n = 3h/tp, k = h) runs each micro-batch's 256 tokens once per layer,
    # in one call or in tp chunks of 128 rows when it is overlapped with its all-gather.
    qkv = shapes[(shapes.n == 3 * 512 // 2) & (shapes.k == 512)]
    assert set(qkv.m) == ({128} if overrides.get("parallelism.overlap_tp_comm") else {256})
    assert (qkv.m * qkv.calls_per_step).sum() == 256 * 8 * wl.microbatches
