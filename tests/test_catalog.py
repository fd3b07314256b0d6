"""Every shipped catalog file loads, is sourced, and holds the numbers it claims.

The sourcing rule (also in docs/catalog.md): in an accelerator or system file, every
numeric value outside ``sources`` must be covered by a ``sources`` entry whose key is
the value's dotted path or the path of one of its ancestors. List indices are dropped
from paths, so ``node.fabric.efficiency`` covers that field in every fabric tier and
``dense_tflops`` covers all of ``dense_tflops.*``. Each citation is a non-empty string;
weak numbers say "unverified" in their citation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmsim import catalog
from llmsim.calibration import parse_gemm_csv
from llmsim.costs.compute import gemm_math_s
from llmsim.loader import load_scenario, load_spec, read_yaml
from llmsim.specs import Accelerator, GemmModel

DATA = Path(__file__).parent / "data"

KINDS = ("accelerators", "collectives", "systems", "models", "scenarios")
ENTRIES = [(kind, name) for kind in KINDS for name in catalog.names(kind)]
SOURCED_KINDS = ("accelerators", "collectives", "systems")

# The catalog the docs and the GPT-4 table promise; a missing file is a regression.
REQUIRED = {
    "accelerators": {
        "v100-sxm2-16gb",
        "v100-sxm3-32gb",
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "h100-sxm5-80gb",
        "mi250x-gcd",
        "pvc-max1550-stack",
        "a64fx",
        "mi300a",
    },
    "collectives": {"nccl-2021", "nccl-2024"},
    "systems": {
        "frontier",
        "lumi",
        "aurora",
        "el-capitan",
        "fugaku",
        "abci-a100",
        "abci-v100",
        "openai-a100",
        "mdx",
        "selene",
        "eos",
        "dgx2h-v100",
    },
    "models": {
        "gpt3-175b",
        "megatron-1t",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "gpt4-proxy-dense",
        "tiny-gpt",
        "gpt2-1.5b",
    },
    "scenarios": {
        "frontier",
        "lumi",
        "aurora",
        "fugaku",
        "abci",
        "el-capitan",
        "openai-a100",
        "mdx",
        "selene-gpt3",
    },
}
GPT4_FLOPS = 3e25
NOT_GPT4_SIZED = {"selene-gpt3", "deepseek-v3"}


def _load(kind: str, name: str) -> Any:
    return load_scenario(name) if kind == "scenarios" else load_spec(kind, name)  # type: ignore[arg-type]


def numeric_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the numbers in a parsed YAML tree (list indices dropped)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from numeric_paths(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for item in node:
            yield from numeric_paths(item, prefix)
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield prefix


def uncovered(raw: dict[str, Any]) -> list[str]:
    """Numeric paths that no ``sources`` key (the path or an ancestor of it) covers."""
    keys = set(raw.get("sources", {}))
    body = {k: v for k, v in raw.items() if k != "sources"}
    missing = []
    for path in numeric_paths(body):
        parts = path.split(".")
        ancestors = {".".join(parts[: i + 1]) for i in range(len(parts))}
        if not ancestors & keys:
            missing.append(path)
    return sorted(set(missing))


@pytest.mark.parametrize("kind", KINDS)
def test_required_entries_exist(kind: str) -> None:
    assert REQUIRED[kind] <= set(catalog.names(kind))


@pytest.mark.parametrize(("kind", "name"), ENTRIES)
def test_entry_loads_and_is_named_after_its_file(kind: str, name: str) -> None:
    spec = _load(kind, name)
    assert spec.name == name


@pytest.mark.parametrize(("kind", "name"), [e for e in ENTRIES if e[0] in SOURCED_KINDS])
def test_every_number_has_a_source(kind: str, name: str) -> None:
    raw = read_yaml(catalog.path_of(kind, name))  # type: ignore[arg-type]
    sources = raw.get("sources")
    assert isinstance(sources, dict) and sources, f"{name}: no sources mapping"
    assert all(isinstance(v, str) and v.strip() for v in sources.values()), name
    assert uncovered(raw) == [], f"{name}: numbers without a source"


def test_source_rule_catches_a_missing_citation() -> None:
    raw = {
        "hbm_gb": 80,
        "gemm": {"peak_fraction": 0.8, "compute_units": 108},
        "node": {"fabric": [{"devices": 8, "efficiency": 0.78}]},
        "tied": True,
        "sources": {"hbm_gb": "datasheet", "gemm": "MAMF", "node.fabric.devices": "x"},
    }
    assert uncovered(raw) == ["node.fabric.efficiency"]


@pytest.mark.parametrize("name", catalog.names("models"))
def test_models_cite_their_architecture(name: str) -> None:
    raw = read_yaml(catalog.path_of("models", name))
    assert raw.get("sources"), f"{name}: no sources"


def test_h100_stores_dense_not_sparse_peaks() -> None:
    h100 = load_spec("accelerators", "h100-sxm5-80gb")
    assert 900 < h100.dense_tflops.bf16 < 1000  # 1,979 would be the 2:4-sparse figure
    assert h100.dense_tflops.fp8 < 2000


def test_mi250x_device_is_one_gcd() -> None:
    gcd = load_spec("accelerators", "mi250x-gcd")
    assert gcd.device_unit == "gcd"
    assert gcd.hbm_gb == 64
    assert gcd.dense_tflops.bf16 == pytest.approx(191.5)  # half of the 383 TF package
    assert load_spec("systems", "frontier").node.devices_per_node == 8


def test_pvc_device_is_one_aurora_stack() -> None:
    stack = load_spec("accelerators", "pvc-max1550-stack")
    assert stack.device_unit == "stack"
    assert stack.gemm.compute_units == 56
    # ALCF measured 2,645 TF BF16 per node of 12 busy stacks at 1.6 GHz, 273 per stack alone:
    # the stored peak × fraction lies between them (tests/test_pvc_gemm.py checks the fit).
    assert 2645 / 12 < stack.dense_tflops.bf16 * stack.gemm.peak_fraction < 273
    assert load_spec("systems", "aurora").node.devices_per_node == 12


def _gemm_s(acc: Accelerator, m: int, n: int, k: int, dtype: str,
            gemm: GemmModel | None = None) -> float:
    """The catalog model's math time of one M×N×K GEMM on ``acc`` (or with ``gemm``)."""
    return gemm_math_s(m, n, k, 1, gemm or acc.gemm, acc.peak_flops(dtype), dtype,
                       memory_bytes_per_s=acc.sustained_memory_bytes_per_s)


@pytest.mark.parametrize(
    ("name", "measured_tflops"),
    [("a100-sxm4-80gb", 230.0), ("a100-sxm4-40gb", 230.0), ("v100-sxm2-16gb", 95.0)],
)
def test_gemm_model_reproduces_the_sourced_8192_cube(name: str, measured_tflops: float) -> None:
    """mli/transformers-benchmarks: sustained 8192³ FP16 matmul, CUDA 11.7 (see the YAML)."""
    acc = load_spec("accelerators", name)
    n = 8192
    seconds = _gemm_s(acc, n, n, n, "fp16")
    assert 2 * n**3 / seconds / 1e12 == pytest.approx(measured_tflops, rel=2e-3)


# H100 SXM GEMMs measured at Llama-70B training shapes with K >= 7168 (SemiAnalysis
# benchmark, [S60]) and by a sustained 60 s 8192³ burn on a whole node ([S61]):
# dtype → [(m, n, k, TFLOP/s)].
H100_GEMMS = {
    "bf16": [(16384, 1024, 8192, 757.7), (16384, 8192, 7168, 752.9),
             (16384, 3584, 8192, 733.0), (8192, 8192, 8192, 729.4), (8192, 8192, 8192, 730.0)],
    "fp8": [(16384, 1024, 8192, 1329.7), (16384, 8192, 7168, 1456.6),
            (16384, 3584, 8192, 1370.3), (8192, 8192, 8192, 1397.5)],
}


def _h100_model_over_measured(dtype: str) -> list[float]:
    acc = load_spec("accelerators", "h100-sxm5-80gb")
    return [2 * m * n * k / _gemm_s(acc, m, n, k, dtype) / 1e12 / tflops
            for m, n, k, tflops in H100_GEMMS[dtype]]


@pytest.mark.parametrize(("dtype", "spread"), [("bf16", 0.03), ("fp8", 0.06)])
def test_h100_gemm_fraction_is_the_fit_to_measurements_at_training_shapes(
    dtype: str, spread: float,
) -> None:
    """The catalog fraction makes the model's geometric-mean ratio to the measurements 1
    (to its three printed digits), and no shape is off by more than ``spread``."""
    ratios = _h100_model_over_measured(dtype)
    assert statistics.geometric_mean(ratios) == pytest.approx(1.0, abs=2e-3)
    assert all(abs(r - 1) <= spread for r in ratios)


def _h100_model_over_xla_table(gemm: GemmModel, shortest_s: float, launch_s: float) -> list[float]:
    """Model time (plus ``launch_s``) over measured time for the shapes of OpenXLA's H100
    BF16 table (tests/data/gemm_h100_xla.csv) measured to run at least ``shortest_s``."""
    acc = load_spec("accelerators", "h100-sxm5-80gb")
    ratios = []
    for p in parse_gemm_csv(DATA / "gemm_h100_xla.csv"):
        measured_s = 2 * p.m * p.n * p.k / (p.tflops * 1e12)
        if measured_s >= shortest_s:
            model_s = _gemm_s(acc, p.m, p.n, p.k, "bf16", gemm)
            ratios.append((model_s + launch_s) / measured_s)
    return ratios


def _log_spread(ratios: list[float]) -> float:
    return statistics.pstdev(math.log(r) for r in ratios)


def test_h100_gemm_model_follows_gemms_measured_by_shape() -> None:
    """The catalog's H100 tiles and split-K follow the measured shape dependence of GEMMs
    from 256 to 4,096 in M, N and K; one 256 × 128 tile without split-K does not."""
    gemm = load_spec("accelerators", "h100-sxm5-80gb").gemm
    one_tile = gemm.model_copy(update={"extra_tiles": [], "split_k": False})
    long = _h100_model_over_xla_table(gemm, 20e-6, 0.0)
    assert len(long) >= 20 and _log_spread(long) < 0.08
    assert 0.95 < statistics.geometric_mean(long) < 1.10
    short = _h100_model_over_xla_table(gemm, 8e-6, 4e-6)
    assert len(short) >= 75 and _log_spread(short) < 0.13 and max(short) < 1.6
    assert _log_spread(_h100_model_over_xla_table(one_tile, 8e-6, 4e-6)) > 0.4


def test_a64fx_has_no_bf16() -> None:
    chip = load_spec("accelerators", "a64fx")
    assert chip.device_unit == "chip"
    assert not chip.supports("bf16")
    assert all(chip.supports(d) for d in ("fp16", "fp32", "fp64"))
    assert chip.attention_fraction == 0


@pytest.mark.parametrize("name", catalog.names("systems"))
def test_a_library_model_keeps_the_systems_own_simple_ring_latencies(name: str) -> None:
    """A system that names its collective library keeps its own step latencies for
    send/recv; they are that library's Simple ring steps, so the two never disagree."""
    system = load_spec("systems", name)
    library = system.network.collectives
    if library is None:
        return
    assert system.network.step_latency_us == library.step_latency_us.network.ring.simple
    for tier in system.node.fabric:
        assert tier.latency_us == library.step_latency_us.fabric.ring.simple


def test_fugaku_torus_holds_exactly_its_nodes() -> None:
    fugaku = load_spec("systems", "fugaku")
    assert math.prod(fugaku.network.dims) == fugaku.nodes == 158_976


def test_frontier_taper_is_the_global_link_ratio() -> None:
    # 512 NIC endpoints x 200 Gb/s per group over 73 peer groups x 4 links x 200 Gb/s.
    frontier = load_spec("systems", "frontier")
    assert frontier.network.global_taper == pytest.approx(512 / (73 * 4), abs=1e-3)


@pytest.mark.parametrize("name", catalog.names("scenarios"))
def test_scenarios_use_the_gpt4_flop_budget(name: str) -> None:
    training = load_scenario(name).training
    if name in NOT_GPT4_SIZED:
        assert training.flops is None and training.tokens
    else:
        assert training.flops == GPT4_FLOPS


@pytest.mark.parametrize("name", sorted(REQUIRED["scenarios"] - NOT_GPT4_SIZED))
def test_gpt4_scenarios_have_a_megatron_layout(name: str) -> None:
    scenario = load_scenario(name)
    par, trn = scenario.parallelism, scenario.training
    assert scenario.description.strip()
    per_node = scenario.system.node.devices_per_node
    assert par.tp <= per_node or per_node == 1  # TP inside a node (Fugaku: over Tofu)
    assert par.zero == 1 and par.sequence_parallel
    assert 16e6 <= trn.global_batch * trn.seq_len <= 10_000 * 8192  # tokens per step
    if par.schedule == "interleaved-1f1b":  # Megatron needs m to be a multiple of pp
        assert scenario.micro_batches % par.pp == 0
