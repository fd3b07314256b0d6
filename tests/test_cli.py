"""The command line end to end: every user error is one sentence and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from llmsim.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["llmsim", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tiny_file(tmp_path: Path, **changes) -> Path:
    raw = {
        "name": "tiny",
        "system": "selene",
        "nodes": 1,
        "model": {"name": "t", "layers": 8, "hidden": 512, "heads": 8, "ffn_hidden": 2048,
                  "vocab": 1024},
        "parallelism": {"tp": 2, "pp": 4, "dp": "auto"},
        "training": {"global_batch": 16, "seq_len": 512, "tokens": 1e9},
    }
    for key, value in changes.items():
        node = raw
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_run_json_has_the_documented_keys(tmp_path, capsys):
    code, out, err = run_cli(["run", str(tiny_file(tmp_path)), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_device", "mfu", "hfu",
                "bubble_fraction", "breakdown_s", "memory", "days_to_train"):
        assert key in data
    assert {"total_gb", "capacity_gb", "fits"} <= set(data["memory"][0])
    assert data["step_time_s"] > 0 and 0 < data["mfu"] < 1


def test_run_writes_result_trace_and_timeline(tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run_cli(["run", str(tiny_file(tmp_path)), "--out", str(out_dir)], capsys)
    assert code == 0, err
    assert "step time" in out and " s" in out
    trace = json.loads((out_dir / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"compute", "tp", "pp", "dp"} <= names
    assert all(e["dur"] >= 0 for e in trace["traceEvents"] if e["ph"] == "X")
    assert (out_dir / "timeline.png").stat().st_size > 10_000
    assert json.loads((out_dir / "result.json").read_text())["step_time_s"] > 0


def test_set_overrides_a_field(tmp_path, capsys):
    code, out, _ = run_cli(["run", str(tiny_file(tmp_path)), "--json",
                            "--set", "parallelism.micro_batch=2"], capsys)
    assert code == 0
    assert json.loads(out)["layout"]["micro_batch"] == 2


def test_report_names_an_uneven_split_and_the_overlaps(tmp_path, capsys):
    path = tiny_file(tmp_path, parallelism__first_stage_layers=1,
                     parallelism__last_stage_layers=1)
    code, out, _ = run_cli(["run", str(path)], capsys)
    text = " ".join(out.split())
    assert code == 0
    assert "layers 1 + 2×3 + 1" in text and "overlap DP" in text
    assert "bias kernels" not in text and "gather" not in text  # defaults are not listed


def test_report_names_framework_switches_that_change_the_result(tmp_path, capsys):
    path = tiny_file(tmp_path, parallelism__zero=3, parallelism__pp=1,
                     parallelism__prefetch_weights=False, parallelism__gather_per_module=True,
                     training__bias_kernels="separate", training__attention_layout_copies=True)
    code, out, err = run_cli(["run", str(path)], capsys)
    text = " ".join(out.split())
    assert code == 0, err
    for name in ("no weight prefetch", "gather per module", "separate bias kernels",
                 "attention layout copies"):
        assert name in text
    assert "tensor-list" not in text and "grad all-reduce" not in text


def test_catalog_lists_bundled_entries(capsys):
    code, out, _ = run_cli(["catalog", "systems"], capsys)
    assert code == 0 and "selene" in out


def test_schedule_show_prints_the_grid(capsys):
    code, out, _ = run_cli(["schedule", "show", "1f1b", "--stages", "4", "--microbatches", "8"],
                           capsys)
    assert code == 0
    assert "F0" in out and "B7" in out


def _error(args, capsys) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    line = " ".join(err.split())
    assert line.startswith("error:")
    return line


def test_malformed_yaml_names_the_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nsystem: selene\nmodel: [unclosed\ntraining: {}\n")
    msg = _error(["run", str(path)], capsys)
    assert "bad.yaml" in msg and "line" in msg and "malformed YAML" in msg


def test_unknown_field_suggests_the_right_one(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path)), "--set", "parallelism.tpp=4"], capsys)
    assert "parallelism.tpp" in msg and "'tp'" in msg


def test_unknown_catalog_name_lists_close_matches(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, system="selen"))], capsys)
    assert "unknown system 'selen'" in msg and "'selene'" in msg
    msg = _error(["run", "frontierr"], capsys)
    assert "unknown scenario" in msg


def test_wrong_type(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, model__layers="many"))], capsys)
    assert "model.layers" in msg and "'many'" in msg


@pytest.mark.parametrize("key, value", [("model__hidden", 0), ("training__seq_len", -5),
                                        ("parallelism__micro_batch", 0)])
def test_zero_or_negative_sizes(tmp_path, capsys, key, value):
    msg = _error(["run", str(tiny_file(tmp_path, **{key: value}))], capsys)
    assert key.replace("__", ".") in msg and str(value) in msg


def test_degrees_that_do_not_multiply(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, parallelism__dp=3))], capsys)
    assert "tp(2)·pp(4)·dp(3) = 24 ≠ 8 devices" in msg


def test_heads_not_divisible_by_tp(tmp_path, capsys):
    path = tiny_file(tmp_path, model__heads=8, parallelism__tp=8, parallelism__pp=1,
                     model__ffn_hidden=2048)
    msg = _error(["run", str(path), "--set", "model.heads=4", "--set", "model.hidden=512"],
                 capsys)
    assert "parallelism.tp: 8 does not divide model.heads=4" in msg


def test_layers_not_divisible_by_pp_times_chunks(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, model__layers=10))], capsys)
    assert "model.layers: 10 is not divisible by pp·virtual_stages" in msg


def test_first_and_last_stage_layers_that_leave_an_uneven_rest(tmp_path, capsys):
    path = tiny_file(tmp_path, parallelism__first_stage_layers=1,
                     parallelism__last_stage_layers=2)
    msg = _error(["run", str(path)], capsys)
    assert "first_stage_layers=1, last_stage_layers=2 leave 5 of model.layers=8" in msg


def test_batch_not_divisible_by_micro_batch_times_dp(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, training__global_batch=7,
                                       parallelism__micro_batch=2))], capsys)
    assert "training.global_batch: 7 is not divisible by micro_batch·dp" in msg


MOE = {"experts": 6, "top_k": 2, "ffn_hidden": 1024}


def test_ep_that_does_not_divide_the_experts(tmp_path, capsys):
    path = tiny_file(tmp_path, model__moe=MOE, parallelism__pp=1, parallelism__ep=4)
    msg = _error(["run", str(path)], capsys)
    assert "parallelism.ep: 4 does not divide model.moe.experts=6" in msg


def test_ep_on_a_dense_model(tmp_path, capsys):
    msg = _error(["run", str(tiny_file(tmp_path, parallelism__pp=2, parallelism__ep=2))],
                 capsys)
    assert "parallelism.ep: 2 needs a mixture-of-experts model" in msg


def test_ep_with_tp_needs_sequence_parallelism(tmp_path, capsys):
    path = tiny_file(tmp_path, model__moe=MOE, parallelism__pp=1, parallelism__ep=2)
    msg = _error(["run", str(path)], capsys)
    assert "parallelism.sequence_parallel: false with ep 2 and tp 2" in msg


def test_cp_that_does_not_split_the_sequence(tmp_path, capsys):
    path = tiny_file(tmp_path, parallelism__pp=1, parallelism__cp=4,
                     training__seq_len=500)
    msg = _error(["run", str(path)], capsys)
    assert "parallelism.cp: 4 does not split training.seq_len=500" in msg


def test_top_k_above_the_experts(tmp_path, capsys):
    path = tiny_file(tmp_path, model__moe=MOE | {"top_k": 7})
    assert "model.moe.top_k: 7 is more than the 6 experts" in _error(["run", str(path)], capsys)


def test_moe_run_reports_the_all_to_all_and_expert_memory(tmp_path, capsys):
    path = tiny_file(tmp_path, model__moe=MOE | {"experts": 8}, parallelism__pp=1,
                     parallelism__ep=2, parallelism__sequence_parallel=True)
    code, out, err = run_cli(["run", str(path)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "EP all-to-all (MoE)" in text
    assert "routed experts: 4 of 8 per device and MoE layer (ep 2)" in text


def test_missing_file_and_bad_set_syntax(tmp_path, capsys):
    assert "file not found" in _error(["run", str(tmp_path / "nope" / "x.yaml")], capsys)
    assert "expected key=value" in _error(["run", str(tiny_file(tmp_path)), "--set", "tp"],
                                          capsys)


def test_unknown_catalog_kind(capsys):
    assert "catalog kind 'gpus'" in _error(["catalog", "gpus"], capsys)


def test_schedule_show_rejects_bad_combinations(capsys):
    _error(["schedule", "show", "interleaved-1f1b", "--stages", "4", "--microbatches", "6",
            "--chunks", "2"], capsys)
    assert "even number of stages" in _error(
        ["schedule", "show", "chimera", "--stages", "3", "--microbatches", "6"], capsys)


@pytest.mark.parametrize(("args", "peaks", "copies"), [
    (["zb-h2", "--stages", "4", "--microbatches", "8"], "7 7 7 7", None),
    (["zb-v", "--stages", "4", "--microbatches", "8", "--chunks", "2"], "8 8 8 8", None),
    (["chimera", "--stages", "4", "--microbatches", "4"], "3 4 4 3", "2 2 2 2"),
    (["pipedream", "--stages", "4", "--microbatches", "8"], "4 3 2 1", "4 3 2 1"),
])
def test_schedule_show_draws_the_new_schedules_with_their_memory(args, peaks, copies, capsys):
    code, out, _ = run_cli(["schedule", "show", *args], capsys)
    assert code == 0 and "stage 3" in out
    assert f"peak in flight per stage (micro-batch-chunks): {peaks}" in out
    assert (f"weight copies per stage: {copies}" in out) if copies else "weight" not in out


def test_a_schedule_the_engine_does_not_replay_is_a_one_line_error(tmp_path, capsys):
    message = _error(["run", str(tiny_file(tmp_path)), "--set",
                      "parallelism.schedule=pipedream"], capsys)
    assert "does not replay it yet" in message


DATA = Path(__file__).parent / "data"


def test_unknown_command_is_a_usage_error_not_a_traceback(capsys):
    code, _, err = run_cli(["calibrat", "gemm"], capsys)
    assert code == 2 and "No such command" in err and "Traceback" not in err


def test_calibrate_gemm_then_nccl_builds_one_profile_a_scenario_uses(tmp_path, capsys):
    from llmsim.calibration import load_calibration, parse_gemm_csv, parse_nccl_tests

    profile = tmp_path / "profile.yaml"
    code, out, err = run_cli(["calibrate", "gemm", str(DATA / "gemm_a100.csv"), "--out",
                              str(profile), "--source", "tests/data A100"], capsys)
    assert code == 0, err
    assert "bf16" in out and f"--set calibration={profile}" in out
    nccl = [DATA / "nccl_all_reduce_8xa100.txt", DATA / "nccl_reduce_scatter_2x8xa100.txt"]
    code, out, err = run_cli(["calibrate", "nccl", *map(str, nccl), "--out", str(profile)],
                             capsys)
    assert code == 0, err
    assert "all_reduce" in out and "reduce_scatter" in out
    cal = load_calibration(profile)
    assert cal.source == "tests/data A100"  # kept: the nccl run gave no --source
    assert cal.gemm == parse_gemm_csv(DATA / "gemm_a100.csv")
    assert cal.collectives == [p for f in nccl for p in parse_nccl_tests(f)]
    # Re-running replaces its own table instead of appending to it.
    run_cli(["calibrate", "gemm", str(DATA / "gemm_a100.csv"), "--out", str(profile)], capsys)
    assert load_calibration(profile).gemm == cal.gemm
    code, out, err = run_cli(["run", str(tiny_file(tmp_path)), "--json", "--set",
                              f"calibration={profile}"], capsys)
    assert code == 0, err
    _, plain, _ = run_cli(["run", str(tiny_file(tmp_path)), "--json"], capsys)
    assert json.loads(out)["step_time_s"] != json.loads(plain)["step_time_s"]


@pytest.mark.parametrize(("command", "name", "where"), [
    ("gemm", "gemm_bad_value.csv", "gemm_bad_value.csv:3"),
    ("gemm", "gemm_missing_column.csv", "gemm_missing_column.csv"),
    ("nccl", "nccl_bad_row.txt", "nccl_bad_row.txt:27"),
    ("nccl", "nccl_no_rows.txt", "nccl_no_rows.txt"),
])
def test_calibrate_a_broken_file_is_one_line_and_writes_nothing(tmp_path, capsys, command,
                                                                 name, where):
    profile = tmp_path / "profile.yaml"
    code, _, err = run_cli(["calibrate", command, str(DATA / "broken" / name), "--out",
                            str(profile)], capsys)
    assert code == 2 and where in err and "Traceback" not in err
    assert not profile.exists()


def test_calibrate_shapes_lists_the_gemms_a_measured_table_then_prices(tmp_path, capsys):
    import csv

    from llmsim import load_scenario
    from llmsim.costs import HardwareCosts
    from llmsim.ops import ComputeOp
    from llmsim.plan import Plan
    from llmsim.workload import build_workload

    scenario_path, shapes = tiny_file(tmp_path), tmp_path / "shapes.csv"
    code, out, err = run_cli(["calibrate", "shapes", str(scenario_path), "--out", str(shapes)],
                             capsys)
    assert code == 0, err
    assert "share %" in out and "benchmarks/time_gemms.py" in out
    lines = shapes.read_text().splitlines()
    assert lines[0].startswith("#")
    rows = list(csv.DictReader(lines[1:]))
    assert {"m", "n", "k", "dtype", "calls_per_step", "flop_share_pct"} <= set(rows[0])
    # "Measure" them: two shapes of one volume get different rates, every other 100 TF/s.
    rates = {("512", "768", "512"): "300", ("512", "512", "768"): "50"}
    assert set(rates) <= {(r["m"], r["n"], r["k"]) for r in rows}
    measured = tmp_path / "gemm.csv"
    measured.write_text("m,n,k,dtype,tflops\n" + "".join(
        f"{r['m']},{r['n']},{r['k']},{r['dtype']},{rates.get((r['m'], r['n'], r['k']), '100')}\n"
        for r in rows))
    profile = tmp_path / "profile.yaml"
    code, _, err = run_cli(["calibrate", "gemm", str(measured), "--out", str(profile)], capsys)
    assert code == 0, err
    scenario = load_scenario(str(scenario_path), [f"calibration={profile}"])
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    workload = build_workload(scenario.model, scenario.parallelism, scenario.training,
                              scenario.dp)
    gemms = {op.name: op for c in workload.chunks.values() for op in (*c.forward, *c.backward)
             if isinstance(op, ComputeOp) and op.kind == "gemm"}
    launch = costs.compute.launch_s
    assert costs.compute_s(gemms["qkv"]) - launch == pytest.approx(gemms["qkv"].flops / 300e12)
    assert costs.compute_s(gemms["qkv_dx"]) - launch == pytest.approx(
        gemms["qkv_dx"].flops / 50e12)


def test_calibrate_shapes_of_validation_rows_and_without_a_scenario(tmp_path, capsys):
    shapes = tmp_path / "zb.csv"
    code, _, err = run_cli(["calibrate", "shapes", "--validation", "ZB24-T4-01", "--out",
                            str(shapes)], capsys)
    assert code == 0, err
    assert "6144,6912,2304,fp16" in shapes.read_text()  # 1.5B QKV: 6 x 1024 tokens, 3h, h
    msg = _error(["calibrate", "shapes", "--out", str(tmp_path / "x.csv")], capsys)
    assert "--validation PREFIX" in msg
    msg = _error(["calibrate", "shapes", "--validation", "XYZ"], capsys)
    assert "--validation 'XYZ' matches no validation row" in msg


def test_time_gemms_reads_the_shapes_and_writes_what_calibrate_gemm_reads(tmp_path, capsys):
    """benchmarks/time_gemms.py (needs PyTorch and a GPU to time) and the CLI agree on
    both files: the shapes it reads and the table it writes."""
    import importlib.util

    from llmsim.calibration import parse_gemm_csv

    script = Path(__file__).parents[1] / "benchmarks" / "time_gemms.py"
    spec = importlib.util.spec_from_file_location("time_gemms", script)
    time_gemms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_gemms)
    shapes = tmp_path / "shapes.csv"
    code, _, err = run_cli(["calibrate", "shapes", str(tiny_file(tmp_path)), "--out",
                            str(shapes)], capsys)
    assert code == 0, err
    rows = time_gemms.read_shapes(shapes)
    assert rows and {"m", "n", "k", "dtype", "batch"} <= set(rows[0])
    table = tmp_path / "gemm.csv"
    timed = [(int(r["m"]), int(r["n"]), int(r["k"]), r["dtype"], 123.456, 7.0) for r in rows]
    time_gemms.write_table(table, "test host", timed)
    points = parse_gemm_csv(table)
    assert [(p.m, p.n, p.k, p.dtype) for p in points] == [t[:4] for t in timed]
    assert {p.tflops for p in points} == {123.46}


def test_time_gemms_passes_the_fp8_accumulation_mode():
    """``--fp8-fast-accum`` reaches ``torch._scaled_mm`` as ``use_fast_accum`` (Transformer
    Engine's forward GEMMs), off by default (its gradient GEMMs); a stand-in for torch
    records the call, so no GPU is needed."""
    import importlib.util
    from types import SimpleNamespace

    script = Path(__file__).parents[1] / "benchmarks" / "time_gemms.py"
    spec = importlib.util.spec_from_file_location("time_gemms", script)
    time_gemms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_gemms)
    calls = []

    class Tensor:
        def to(self, _dtype):
            return self

        def t(self):
            return self

    fake = SimpleNamespace(
        backends=SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace())),
        _scaled_mm=lambda *a, **kw: calls.append(kw["use_fast_accum"]),
        cuda=SimpleNamespace(get_device_capability=lambda: (9, 0)),
        randn=lambda *a, **kw: Tensor(), ones=lambda *a, **kw: Tensor(),
        float8_e4m3fn="e4m3", bfloat16="bf16")
    for fast in (False, True):
        time_gemms.operands(fake, 16, 16, 16, "fp8", "cuda", fp8_fast_accum=fast)()
    time_gemms.operands(fake, 16, 16, 16, "fp8", "cuda")()
    assert calls == [False, True, False]


def test_starting_loads_no_table_or_plotting_library():
    """``import llmsim`` and the command line load pandas and matplotlib only when a
    command uses them (their import is most of a start's fixed cost)."""
    import subprocess

    code = ("import sys, llmsim, llmsim.cli; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'llmsim.specs') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"
    code = ("import sys, llmsim; r = llmsim.simulate(llmsim.load_scenario('selene-gpt3')); "
            "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"


def test_a_long_simulation_reports_its_progress(capsys: pytest.CaptureFixture[str]) -> None:
    from llmsim.cli import _simulation_progress

    report = _simulation_progress()
    report(0.25)
    err = capsys.readouterr().err
    assert "25 % of the pipeline actions begun" in err and "s left" in err
