"""Bad input, class by class: one sentence and exit code 2, in bounded time, never a
traceback (issue #40). The fuzz tests at the end draw scenario mappings and raw bytes."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import make_scenario, tiny_raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import run_cli as cli

from llmsim import load_scenario, load_spec, simulate
from llmsim.calibration import load_calibration, parse_gemm_csv, parse_nccl_tests
from llmsim.costs.host_issue import HostIssue
from llmsim.errors import UserError
from llmsim.safe_yaml import MAX_FILE_BYTES, parse_yaml

TINY = tiny_raw()




def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI's error for ``args``: exit code 2, one line on stderr, no traceback."""
    code, _, err = cli(args, capsys)
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def write(tmp_path: Path, data: bytes | str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def refused(source: Any, *overrides: str, match: str | None = None) -> str:
    with pytest.raises(UserError, match=match) as info:
        load_scenario(source, list(overrides))
    return str(info.value)


# -- encodings ------------------------------------------------------------------------------


def test_utf16_with_a_bom_reads_as_the_utf8_file(tmp_path):
    text = yaml.safe_dump(TINY)
    utf8 = load_scenario(write(tmp_path, text, "a.yaml"))
    for encoding in ("utf-16", "utf-8-sig", "utf-32"):  # each writes its byte-order mark
        assert load_scenario(write(tmp_path, text.encode(encoding), "b.yaml")) == utf8


def test_latin1_names_the_line_and_asks_for_utf8(tmp_path, capsys):
    path = write(tmp_path, "name: tiny\ndescription: caf\xe9\n".encode("latin-1"))
    err = one_line_error(["run", str(path)], capsys)
    assert "line 2" in err and "0xe9" in err and "UTF-8" in err


def test_paths_that_cannot_be_opened(tmp_path):
    for path in ("a\x00b.yaml", str(tmp_path), str(tmp_path / "missing.yaml")):
        with pytest.raises(UserError, match="cannot read"):
            load_calibration(path)


def test_a_binary_file_is_not_a_scenario(tmp_path, capsys):
    path = write(tmp_path, bytes(range(256)) * 4)
    assert "not" in one_line_error(["run", str(path)], capsys)
    path = write(tmp_path, b"name: x\n\x00\x00\x00")
    assert "NUL byte" in one_line_error(["run", str(path)], capsys)


# -- YAML structure --------------------------------------------------------------------------


def test_yaml_nested_a_thousand_deep(tmp_path, capsys):
    flow = write(tmp_path, "a: " + "[" * 1000 + "]" * 1000, "flow.yaml")
    assert "nested deeper than 64" in one_line_error(["run", str(flow)], capsys)
    block = "".join("  " * i + f"k{i}:\n" for i in range(1000))
    assert "nested deeper" in one_line_error(["run", str(write(tmp_path, block))], capsys)


BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def test_alias_bomb_is_refused_quickly_and_not_echoed(tmp_path, capsys):
    assert len(BILLION_LAUGHS.encode()) < 600  # nine levels of nine: 9^9 items
    start = time.perf_counter()
    err = one_line_error(["run", str(write(tmp_path, BILLION_LAUGHS))], capsys)
    assert time.perf_counter() - start < 5
    assert "expand to more than" in err and len(err) < 300
    # In a field pydantic echoes: the value quoted back is cut short.
    bomb = BILLION_LAUGHS.replace("i: &i", "name: &i")
    assert "expand" in one_line_error(["run", str(write(tmp_path, bomb))], capsys)
    shared = "a: &a [" + ", ".join(["x"] * 200) + "]\nname: [*a, *a, *a]\n"
    err = one_line_error(["run", str(write(tmp_path, shared))], capsys)
    assert len(err) < 400


def test_a_long_unknown_key_is_not_echoed_whole():
    message = refused(TINY | {"k" * 100_000: 1}, match="unknown field")
    assert len(message) < 1000


def test_an_alias_inside_its_own_node(tmp_path, capsys):
    err = one_line_error(["run", str(write(tmp_path, "name: &n [1, *n]\n"))], capsys)
    assert "refers to the node that holds it" in err


@pytest.mark.parametrize("text", ["a: !!int abc", "a: !!float x", "a: !!timestamp x",
                                  "a: !!bool maybe", "a: !!int 0x", "a: !!int " + "9" * 5000,
                                  "a: !!python/object:os.system x"])
def test_explicit_tags_that_do_not_fit_their_value(text):
    with pytest.raises(yaml.YAMLError):
        parse_yaml(text)


def test_duplicate_keys_are_refused(tmp_path, capsys):
    text = yaml.safe_dump(TINY) + "nodes: 2\n"
    err = one_line_error(["run", str(write(tmp_path, text))], capsys)
    assert "'nodes' is given twice" in err and "first on line" in err
    with pytest.raises(yaml.YAMLError, match="given twice"):
        parse_yaml("{tp: 1, tp: 2}")


def test_yaml_1_1_surprises_read_as_yaml_1_2():
    assert parse_yaml("a: 010\nb: 1:20\nc: 1e9\nd: yes\ne: 2024-01-01\nf: 0o17\ng: 0x1f") == {
        "a": 10, "b": "1:20", "c": 1e9, "d": "yes", "e": "2024-01-01", "f": 15, "g": 31}
    s = load_scenario(TINY, ["training.global_batch=016", "parallelism.overlap_dp_comm=no"])
    assert s.training.global_batch == 16 and s.parallelism.overlap_dp_comm is False
    assert "1:20" in refused(TINY, "training.global_batch=1:20")


# -- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("override", ["training.tokens=.inf", "training.step_overhead_s=.nan",
                                      "parallelism.dp_bucket_mb=-.inf"])
def test_inf_and_nan_in_float_fields(override):
    assert "finite" in refused(TINY, override)


@pytest.mark.parametrize("value", ["1e30", str(10**30), str(2**53 + 1)])
def test_integers_too_large_for_the_arithmetic(value):
    message = refused(TINY, f"model.layers={value}")
    assert "model.layers" in message


def test_a_layer_gathered_past_any_framework_s_calls_is_refused():
    """``parallelism.gathers_per_call`` multiplies a ZeRO-3 step's gathers: a million made
    a step of 10^8 ops (5.9 GB after 120 s); at most 64 keeps it bounded."""
    message = refused(TINY, "parallelism.gathers_per_call=1000000")
    assert "parallelism.gathers_per_call" in message and "64" in message


def test_results_that_would_be_infinite_or_zero():
    s = make_scenario()

    class Free:
        host_issue = HostIssue(0.0, 0.0)

        def compute_s(self, op: Any) -> float:
            return 0.0

        def comm_s(self, op: Any) -> float:
            return 0.0

    with pytest.raises(UserError, match=r"step takes 0\.0 s"):
        simulate(s, Free())
    result = simulate(s)
    broken = dataclasses.replace(result, step_time_s=math.inf)
    data = yaml.safe_load(broken.to_json())  # JSON is YAML
    assert data["step_time_s"] is None
    assert "step_time_s is inf, written as null" in data["warnings"]
    stages = [dataclasses.replace(result.stages[0], bubble_s=math.nan), *result.stages[1:]]
    data = yaml.safe_load(dataclasses.replace(result, stages=stages).to_json())
    assert data["breakdown_per_stage_s"][0]["bubble"] is None
    assert "breakdown_per_stage_s[0].bubble is nan, written as null" in data["warnings"]


# -- catalog names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["x" * 300, "../../../etc/passwd", "a/b", "..", ".hidden",
                                  "é" * 200])
def test_catalog_names_that_escape_or_overflow(name, tmp_path, capsys):
    message = refused(TINY, f"system={name}", match="not a system name")
    assert len(message) < 300
    err = one_line_error(["run", name], capsys)
    assert len(err) < 300


# -- inputs that would take long or much memory ------------------------------------------


def test_a_tiny_gradient_bucket_is_refused_at_load():
    start = time.perf_counter()
    message = refused(TINY, "nodes=2", "parallelism.dp_bucket_mb=1e-9")
    assert time.perf_counter() - start < 5
    assert "max_sim_passes" in message and "dp_bucket_mb" in message
    assert "max_sim_passes" in refused(TINY, "nodes=2", "parallelism.dp_bucket_mb=1e-99")
    # a subnormal bucket is below the float range every field keeps (specs._base)
    assert "dp_bucket_mb = 5e-324" in refused(TINY, "nodes=2", "parallelism.dp_bucket_mb=5e-324")


def test_full_fidelity_on_65536_devices_needs_insisting():
    message = refused("frontier", "fidelity=full", match="max_sim_passes")
    assert "fidelity: reduced" in message
    passes = int(message.split("take ")[1].split(" layer")[0].replace(",", ""))
    insisted = load_scenario("frontier", ["fidelity=full", f"max_sim_passes={passes}"])
    assert insisted.devices == 65536 and insisted.sim_passes == passes


@pytest.mark.parametrize("parse", [parse_gemm_csv, parse_nccl_tests, load_calibration])
def test_calibration_files_that_never_end(parse, tmp_path):
    if Path("/dev/zero").exists():
        with pytest.raises(UserError, match="larger than 16 MiB"):
            parse("/dev/zero")
    big = tmp_path / "big.csv"
    big.write_bytes(b"m,n,k,dtype,tflops\n" + b"#" * MAX_FILE_BYTES)
    with pytest.raises(UserError, match="larger than 16 MiB"):
        parse(big)


def test_dev_zero_as_a_calibration_profile_of_a_scenario(capsys):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    err = one_line_error(["run", "selene-gpt3", "--set", "calibration=/dev/zero"], capsys)
    assert "larger than 16 MiB" in err


# -- layouts ---------------------------------------------------------------------------------


def test_interleaved_micro_batches_not_a_multiple_of_pp():
    message = refused(TINY, "nodes=2", "training.global_batch=12",
                      "parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=2")
    for field in ("global_batch", "micro_batch", "dp", "pp = 4"):
        assert field in message
    # Each suggested global batch runs.
    suggested = message.split("use global_batch ")[1].split(",")[0].split(" or ")
    for batch in suggested:
        load_scenario(TINY, ["nodes=2", f"training.global_batch={batch}",
                             "parallelism.schedule=interleaved-1f1b",
                             "parallelism.virtual_stages=2"])


def test_seq_len_above_max_seq_len_warns():
    result = simulate(make_scenario(training__seq_len=2048))  # the tiny model's is 1024
    assert any("max_seq_len 1024" in w for w in result.warnings)
    assert not any("max_seq_len" in w for w in simulate(make_scenario()).warnings)


# -- fuzz ------------------------------------------------------------------------------------

PATHS = ["name", "system", "nodes", "model", "model.layers", "model.hidden", "model.heads",
         "model.kv_heads", "model.vocab", "model.max_seq_len", "model.activation",
         "parallelism", "parallelism.tp", "parallelism.pp", "parallelism.dp",
         "parallelism.micro_batch", "parallelism.zero", "parallelism.schedule",
         "parallelism.virtual_stages", "parallelism.dp_bucket_mb", "parallelism.rank_order",
         "parallelism.first_stage_layers", "training", "training.global_batch",
         "training.seq_len", "training.tokens", "training.flops", "training.precision",
         "training.step_overhead_s", "training.hidden_dropout", "fidelity", "calibration",
         "max_sim_passes", "system.node", "system.nodes"]
VALUES = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2, max_value=70),
    st.sampled_from([0, 2**31, 2**53 + 1, 10**30, -10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 5e-324, 1e300, -0.0, 0.5, 1.5]),
    st.text(max_size=12),
    st.sampled_from(["auto", "selene", "frontier", "../x", "x" * 300, "interleaved-1f1b",
                     "full", "/dev/zero", "1:20", ".inf"]),
    st.lists(st.integers(-1, 9), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-1, 9), max_size=2),
)


# The system inline, as loaded once: the fuzz then spends its time on the changes, not on
# reading the same catalog files again (a "system" change may still name one).
FUZZ_BASE = TINY | {"system": load_spec("systems", "selene").model_dump()}


@settings(max_examples=200, deadline=5000, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=4))
def test_fuzz_scenario_mappings_give_a_scenario_or_one_user_error(changes):
    overrides = {path: value for path, value in changes}
    try:
        scenario = load_scenario(FUZZ_BASE, overrides)
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000
        return
    assert scenario.sim_passes <= scenario.max_sim_passes


HUGE_OR_TINY = st.sampled_from([1e-300, 5e-324, 1e300, 2**53])  # 5e-324: least above 0
NEAR_VALID = {  # per field, values that often load, so that the simulation runs
    "nodes": st.sampled_from([1, 2, 4]),
    "fidelity": st.sampled_from(["reduced", "full"]),
    "model.layers": st.integers(1, 16) | HUGE_OR_TINY,
    "model.hidden": st.sampled_from([8, 64, 512, 2048, 2**20]),
    "model.heads": st.sampled_from([1, 2, 4, 8]),
    "model.kv_heads": st.sampled_from([1, 2, 4, 8]),
    "model.vocab": st.integers(1, 2**17) | HUGE_OR_TINY,
    "model.ffn_hidden": st.sampled_from([8, 2048, 2**24]),
    "model.max_seq_len": st.sampled_from([1, 512, 2**20]),
    "model.activation": st.sampled_from(["gelu", "swiglu"]),
    "model.tied_embeddings": st.booleans(),
    "parallelism.micro_batch": st.sampled_from([1, 2, 4, 8, 16]),
    "parallelism.zero": st.integers(0, 3),
    "parallelism.schedule": st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]),
    "parallelism.virtual_stages": st.integers(1, 4),
    "parallelism.dp_bucket_mb": st.floats(1e-3, 1e4) | HUGE_OR_TINY,
    "parallelism.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallelism.sequence_parallel": st.booleans(),
    "training.global_batch": st.sampled_from([8, 16, 32, 64, 2**20]),
    "training.seq_len": st.sampled_from([1, 7, 512, 2048, 2**16]),
    "training.tokens": st.floats(1, 1e15) | HUGE_OR_TINY,
    "training.precision": st.sampled_from(["bf16", "fp16", "fp8", "fp32"]),
    "training.step_overhead_s": st.sampled_from([0, 1.0]) | HUGE_OR_TINY,
    "training.attention_kernel": st.sampled_from(["flash", "cudnn", "unfused"]),
}


@settings(max_examples=30, deadline=10_000, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(sorted(NEAR_VALID)).flatmap(
    lambda path: st.tuples(st.just(path), NEAR_VALID[path])), min_size=1, max_size=4))
def test_fuzz_simulating_what_loads_gives_a_result_or_one_user_error(changes):
    overrides = {path: value for path, value in changes} | {"max_sim_passes": 20_000}
    try:
        result = simulate(load_scenario(FUZZ_BASE, overrides))
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 < result.step_time_s < math.inf
    assert "NaN" not in result.to_json() and "Infinity" not in result.to_json()


YAML_BITS = st.sampled_from(["a", ":", " ", "\n", "- ", "[", "]", "{", "}", ",", "&x", "*x",
                             "!!python/object:os.system", "!!binary", "? ", "'", '"', "#",
                             "!!int ", "!!float ", "!!timestamp ", "!!bool ", "!!set ",
                             "<<: ", "|", ">", "%YAML 1.1\n", "---\n", "...\n", "\t", "1e9",
                             "nodes", "system: selene", "model: ", ".inf", "~"])


TINY_TEXT = yaml.safe_dump(TINY)


@settings(max_examples=200, deadline=5000, suppress_health_check=list(HealthCheck))
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(YAML_BITS, max_size=40).map(lambda bits: "".join(bits).encode()),
    st.tuples(st.integers(0, len(TINY_TEXT)), st.lists(YAML_BITS, max_size=5)).map(
        lambda at: (TINY_TEXT[:at[0]] + "".join(at[1]) + TINY_TEXT[at[0]:]).encode()),
))
def test_fuzz_raw_bytes_give_a_scenario_or_one_user_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_bytes(data)
    try:
        load_scenario(path)
    except UserError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000


# -- the fields of 2026-11-27 (retention, TE host loops, ALiBi, the ring step floor) -------


@pytest.mark.parametrize("override, names", [
    ("system.retention_state=maybe", ["system.retention_state", "'maybe'", "boolean"]),
    ("system.retention_state=true", ["system.retention_state", "retention_wake_ms", "false"]),
    ("system.node.accelerator.retention_wake_ms=0", ["retention_wake_ms", "greater than 0"]),
    ("training.expert_host_loop=maybe", ["training.expert_host_loop", "'maybe'", "boolean"]),
    ("model.position_embedding=sinusoidal", ["position_embedding", "'sinusoidal'", "'alibi'"]),
    ("system.network.ring_post_us={ll: -1, ll128: 2, simple: 6}",
     ["ring_post_us.ll", "-1", "greater than or equal to 0"]),
    ("system.network.ring_post_us={ll: 1}", ["ring_post_us.ll128", "add it"]),
    ("system.network.ring_post_us=-1", ["ring_post_us", "-1", "a mapping of ll, ll128, simple"]),
    ("system.network.collectives.ring_network_post_tuned=maybe",
     ["ring_network_post_tuned", "'maybe'", "boolean"]),
])
def test_bad_values_of_the_new_fields_give_one_sentence(override, names, capsys):
    err = one_line_error(["run", "selene-gpt3", "--set", override], capsys)
    for name in names:
        assert name in err, err


@pytest.mark.parametrize("scenario, override, names", [
    ("frontier.yaml", "system.network.ring_post_us={ll: 1, ll128: 2, simple: 6}",
     ["network.ring_post_us", "network.collectives", "remove ring_post_us"]),
    ("selene-gpt3", "system.network.ring_step_floor={fabric_us: 20, network_us: 30, "
     "from_bytes: 1048576}", ["network.ring_step_floor", "network.collectives"]),
    ("selene-gpt3", "system.network.collective_algorithms={all_gather: [ring]}",
     ["network.collective_algorithms", "network.collectives"]),
])
def test_network_fields_that_would_be_ignored_are_refused(scenario, override, names, capsys):
    """A field that only acts with (or only without) a collective library's cost model is
    an error where it would silently do nothing."""
    err = one_line_error(["run", scenario, "--set", override], capsys)
    for name in names:
        assert name in err, err


@pytest.mark.parametrize("override, names", [
    ("training.expert_loop=deepspeed_uneven", ["training.expert_loop", "dense"]),
    ("parallelism.modules_per_layer=7",
     ["parallelism.modules_per_layer", "gather_per_module", "grad_buckets_whole_matrices"]),
    ("parallelism.recompute=full_keep_attention,parallelism.recompute_norms_and_up_proj=true",
     ["parallelism.recompute_norms_and_up_proj", "full_keep_attention"]),
])
def test_new_fields_that_would_be_ignored_or_double_counted_are_refused(override, names,
                                                                        capsys):
    """A field of today's merges that would do nothing where it is set (an expert loop on
    a dense model, a module count with neither per-module gathers nor whole-matrix buckets),
    or recompute the norms twice (full_keep_attention reruns them already), is an error."""
    args = ["run", "selene-gpt3"]
    for one in override.split(","):
        args += ["--set", one]
    err = one_line_error(args, capsys)
    for name in names:
        assert name in err, err


def test_a_framework_share_without_a_measured_curve_is_refused(capsys):
    """``gemm.framework_share`` scales ``gemm.square_fraction``; on an accelerator without
    that curve (an A100) it would be silently ignored."""
    err = one_line_error(["run", "selene-gpt3", "--set",
                          "system.node.accelerator.gemm.framework_share=0.5"], capsys)
    assert "gemm.framework_share" in err and "square_fraction" in err, err


@pytest.mark.parametrize("kernel, field", [("triton_fwd", "triton_fwd_vs_flash2_ms"),
                                           ("flash1", "flash1_vs_flash2_tflops")])
def test_an_attention_ratio_without_sequence_lengths_is_refused(kernel, field, capsys):
    """A head dimension with no sequence lengths in a kernel-ratio table was a numpy
    traceback (``np.interp`` over no points) when the kernel was priced."""
    err = one_line_error(["run", "selene-gpt3", "--set", f"training.attention_kernel={kernel}",
                          "--set", f"system.node.accelerator.{field}={{128: {{}}}}"], capsys)
    assert f"{field}[128] has no sequence lengths" in err, err


def test_unfused_rope_without_rope_is_refused(capsys):
    """``training.rope: unfused`` on GPT-3's learned positions has no rotary kernel to
    price (it was silently ignored)."""
    err = one_line_error(["run", "selene-gpt3", "--set", "training.rope=unfused"], capsys)
    assert "training.rope" in err and "learned" in err, err


def test_hf_eager_with_complex_rope_is_refused(capsys):
    """Hugging Face's eager path prices its own unfused RoPE, so an explicit complex RoPE
    beside it would be silently overridden: refused instead."""
    err = one_line_error(["run", "workloads/scenarios/frontier.yaml",
                          "--set", "model.position_embedding=rope", "--set", "model.norm=rmsnorm",
                          "--set", "model.activation=swiglu", "--set",
                          "training.pointwise_ops=hf_eager", "--set", "training.rope=complex"],
                         capsys)
    assert "training.rope: complex" in err and "hf_eager" in err, err


# -- a whole entry's rule, a misplaced value or tag: one short sentence, no entry dumped --


@pytest.mark.parametrize("scenario, override, names", [
    ("selene-gpt3", "system.node.accelerator.gemm.framework_share=0.5",
     ["system.node.accelerator.gemm.framework_share: 0.5"]),
    ("selene-gpt3", "system.node.accelerator.dense_tflops={}",
     ["system.node.accelerator: accelerator 'a100-sxm4-80gb': dense_tflops"]),
    ("selene-gpt3", "system.node.fabric=[]", ["system.node.fabric is empty"]),
    ("selene-gpt3", "system.network.collectives.tree_max_bus_gbps=null",
     ["system.network.collectives: collective library 'nccl-2021'", "tree_max_bus_gbps"]),
    ("selene-gpt3", "model.hidden=1", ["model.heads: 96 does not divide hidden=1"]),
    ("selene-gpt3", "parallelism.rank_order=[]", ["parallelism.rank_order: []"]),
    ("abci", "system.groups=-1", ["system.groups = -1 is not a list"]),
    ("selene-gpt3", "system.groups=-1", ["system.groups = -1 is not a list"]),
])
def test_an_entrys_own_rule_names_the_field_not_the_entry(scenario, override, names, capsys):
    """A rule over a whole catalog entry (an accelerator's, a node's, a network's, a
    collective library's, a model's, a layout's) names the field under its full path and
    does not quote the entry's contents (it quoted the first 80 characters of its dict);
    a system's ``groups`` that is not a list was a TypeError traceback."""
    err = one_line_error(["run", scenario, "--set", override], capsys)
    for name in names:
        assert name in err, err
    assert "{'" not in err and len(err) < 400, err


def test_a_network_rule_names_the_network_field(capsys):
    """``ring_post_us`` without a collective library: the network's rule, at its path."""
    err = one_line_error(["run", "selene-gpt3", "--set", "system.network.collectives=null",
                          "--set", "system.network.ring_post_us={ll: 1, ll128: 2, simple: 6}"],
                         capsys)
    assert "system.network.ring_post_us is set without" in err and "{'" not in err, err


@pytest.mark.parametrize("override, names", [
    ("parallelism=1", ["parallelism = 1 is not a mapping of tp, pp", "more"]),
    ("system.node.accelerator=5", ["accelerator = 5 is not a catalog name", "accelerators"]),
    ("system.network.collectives=[]", ["is not a catalog name", "collectives"]),
    ("parallelism.zzzzzzzz=1", ["unknown field 'parallelism.zzzzzzzz'", "more"]),
    ("system.network.kind=zz", ["system.network.kind = 'zz' is not allowed", "'fat_tree'"]),
    ("system.network={nodes_per_leaf: 4}", ["system.network has no 'kind'; add it"]),
])
def test_misplaced_values_and_tags_give_a_short_sentence(override, names, capsys):
    """A bare value where an entry belongs, an unknown field with no close name, and a
    network's missing or unknown ``kind``: the field, the value and the fix in a short
    sentence (the field lists ran to a thousand characters, the tag errors quoted the
    whole network)."""
    err = one_line_error(["run", "selene-gpt3", "--set", override], capsys)
    for name in names:
        assert name in err, err
    assert "{'" not in err and len(err) < 400, err


def test_setting_into_a_long_value_quotes_it_short(capsys):
    """``--set a.b=…`` where ``a`` is not a mapping quotes ``a``'s value cut short (it was
    quoted whole)."""
    err = one_line_error(["run", "selene-gpt3", "--set", "description=" + "x" * 5000,
                          "--set", "description.more=1"], capsys)
    assert "description is 'xxx" in err and len(err) < 300, err


# -- DeepSpeed's MoE layers beside Megatron-Core's switches; Hugging Face eager on MLA/MoE --


@pytest.mark.parametrize("overrides, names", [
    (["parallelism.moe_dispatcher=deepspeed", "model.moe.capacity_factor=1.0",
      "parallelism.moe_a2a_overlap=true"],
     ["parallelism.moe_a2a_overlap: true with moe_dispatcher: deepspeed", "alltoall"]),
    (["training.expert_loop=deepspeed_uneven", "parallelism.moe_a2a_overlap=true"],
     ["parallelism.moe_a2a_overlap: true with training.expert_loop: deepspeed_uneven",
      "grouped"]),
    (["parallelism.moe_dispatcher=deepspeed", "model.moe.capacity_factor=1.0",
      "training.expert_loop=deepspeed_uneven"],
     ["training.expert_loop: deepspeed_uneven with parallelism.moe_dispatcher: deepspeed",
      "grouped", "alltoall"]),
    (["training.pointwise_ops=hf_eager"],
     ["training.pointwise_ops: hf_eager", "no experts", "gpt4-proxy-moe", "fused"]),
])
def test_deepspeed_moe_and_hf_eager_combinations_nothing_runs_are_refused(overrides, names,
                                                                          capsys):
    """DeepSpeed 0.5.8's ``MOELayer`` (1bc13fe83) and X-MoE's ``MOEv2Layer`` (33c69c95) call
    their all-to-alls in line, so Megatron-Core's all-to-all overlap does not apply to them;
    X-MoE's uneven expert loop runs only behind its padding-free dispatch (its einsum
    branch unpacks the padding-free gate's six outputs into four); Hugging Face's eager
    LLaMA chain describes no MoE model. Each was accepted and priced."""
    args = ["run", "frontier-moe"]
    for one in overrides:
        args += ["--set", one]
    err = one_line_error(args, capsys)
    for name in names:
        assert name in err, err


def test_hf_eager_on_mla_is_refused(capsys):
    """DeepSeek-V3's MLA has its own norms and a decoupled RoPE that the LLaMA chain does
    not price (the chain's RoPE was silently dropped)."""
    err = one_line_error(["run", "deepseek-v3", "--set", "training.pointwise_ops=hf_eager"],
                         capsys)
    assert "training.pointwise_ops: hf_eager" in err and "has MLA" in err, err


def test_deepspeed_dispatcher_and_uneven_loop_still_run_apart():
    """Each of the two DeepSpeed settings alone, without the overlap, still loads."""
    for overrides in ({"parallelism.moe_dispatcher": "deepspeed",
                       "model.moe.capacity_factor": 1.0},
                      {"training.expert_loop": "deepspeed_uneven"}):
        scenario = load_scenario("frontier-moe", overrides | {
            "parallelism.moe_a2a_overlap": False})
        assert not scenario.parallelism.moe_a2a_overlap


# -- numbers that loaded and then broke the arithmetic, the calendar or the time bound -------


@pytest.mark.parametrize("override, names", [
    ("system.node.accelerator.hbm_tbps=1e300", ["hbm_tbps", "outside"]),
    ("system.node.accelerator.clocks.max_mhz=1e-300", ["clocks.max_mhz", "outside"]),
    ("system.node.accelerator.gemm.peak_fraction_by_dtype={fp8: 1e-300}",
     ["peak_fraction_by_dtype[fp8] = 1e-300 is outside"]),
    ("system.node.accelerator.gemm.peak_fraction_by_dtype={fp8: 0}",
     ["peak_fraction_by_dtype.fp8 = 0", "greater than 0"]),
    ("training.power_limit_w=1", ["training.power_limit_w: 1.0 W", "static_w", "700.0 W"]),
    ("system.network.collectives.ring_bandwidth_fraction.ll=0",
     ["ring_bandwidth_fraction.ll is 0.0", "above 0"]),
    ("system.network.collectives.tree_protocol_fraction.simple=0",
     ["tree_protocol_fraction.simple is 0.0"]),
    ("system.network.collectives.tree_correction.ll=[0]", ["tree_correction.ll[0] = 0"]),
    ("seed=-1", ["seed = -1", "greater than or equal to 0"]),
    ("calendar.monte_carlo_runs=100000000", ["calendar.monte_carlo_runs", "1000000"]),
])
def test_numbers_that_broke_the_arithmetic_are_refused(override, names, capsys):
    """Each loaded and then raised a ZeroDivisionError or numpy's ValueError in the
    simulation or the calendar (or, for the Monte Carlo runs, asked for gigabytes): a
    zero or underflowing fraction or clock, a power limit at or below the static power, a
    negative seed, a billion runs."""
    scenario = "deepseek-v3" if "clocks" in override or "power_limit" in override \
        or "fp8" in override else "selene-gpt3"
    err = one_line_error(["run", scenario, "--set", override], capsys)
    for name in names:
        assert name in err, err


def test_a_run_of_absurd_length_is_refused_by_the_calendar(capsys):
    """10³⁰ tokens load (a float in range) and were a numpy ValueError in the Monte
    Carlo's negative binomial (its Poisson mean past 9.2·10¹⁸) or a negative array size
    (the failures' sum overflowed 64 bits)."""
    err = one_line_error(["run", "selene-gpt3", "--set", "training.tokens=1e30"], capsys)
    assert "calendar: the run is" in err and "training.tokens" in err, err


def test_a_model_of_2_to_the_53_layers_is_refused_without_counting_them():
    """MoE.moe_layers counted the layers one by one: a DeepSeek-V3 of 2^53 layers hung
    in the model's validation; the count is now a closed form, equal to the loop."""
    message = refused("deepseek-v3", f"model.layers={2**53}")
    assert "model.layers" in message
    from llmsim.specs.model import MoE
    for first, freq, layers in [(0, 1, 7), (3, 1, 61), (3, 2, 61), (5, 3, 4), (1, 4, 10)]:
        moe = MoE(experts=8, top_k=2, ffn_hidden=64, first_dense_layers=first,
                  layer_freq=freq)
        assert moe.moe_layers(layers) == sum(moe.is_moe_layer(i) for i in range(layers))


def test_multi_token_prediction_modules_count_in_the_simulation_bound():
    """``model.mtp_depth`` 2^53 loaded (the bound counted only the model's layers) and the
    workload's loop over the modules ran out of memory; the last stage's modules now count
    among its layers."""
    message = refused("selene-gpt3", f"model.mtp_depth={2**53}")
    assert "max_sim_passes" in message and "model.mtp_depth" in message
    base = load_scenario("deepseek-v3")
    flat = load_scenario("deepseek-v3", {"model.mtp_depth": 0})
    assert base.sim_passes - flat.sim_passes == base.parallelism.pp * base.micro_batches


def test_a_name_too_long_for_the_report_is_refused(capsys):
    """A 100,000-character model name loaded and held ``llmsim run`` over a minute in
    rich's highlighting of the report's first line (its cost grows with the square of
    the line); names are now at most 200 characters."""
    err = one_line_error(["run", "selene-gpt3", "--set", "model.name=" + "x" * 100_000],
                         capsys)
    assert "model.name" in err and "at most 200 characters" in err and len(err) < 300, err
    assert load_scenario("selene-gpt3", {"model.name": "m" * 200}).model.name == "m" * 200
