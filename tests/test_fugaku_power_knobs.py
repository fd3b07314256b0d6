"""Fugaku's power knobs and NUMA placement against the development rows (issue 36).

llmsim prices core retention (Fugaku's default below 9,217 nodes: an idle core drops to
a low-power state and takes about 3 ms to run again) only where the OpenMP workers sleep,
after libomp's 200 ms block time, which no one-node row's wait reaches
(:mod:`llmsim.costs.retention`, ``tests/test_core_retention.py``); the boost clock
(2.2 GHz, the job's ``freq=2200``) is a catalog device of its own (``a64fx-boost``,
``a64fx-cmg-boost``). The rows' own source also timed its one-node configurations with
``retention_state=0``, at 2.2 GHz, and with all of that and tcmalloc; these tests hold
llmsim against those runs and check from the catalog that weights first-touched on one CMG
cost the GEMMs no ring-bus bandwidth (docs/validation.md section 8, "Power knobs, NUMA
placement and small GEMMs").
"""

from __future__ import annotations

from typing import Any

import pytest

from llmsim import catalog
from llmsim.loader import load_scenario, load_spec, read_yaml

RETENTION_OFF_S = {
    # Fugaku-LLM/DeepSpeedFugaku experiments/124m_13b_benchmarking/fugaku_sweep.md (history
    # before commit bb88177, last version 35c25d4): the same one-node run as the row, with the
    # job's power knob retention_state=0, 2.0 GHz, glibc malloc, PyTorch 1.7.
    "FUGAKU-DEV-6": 10023.9,  # 1.3B, '1 ("retention_state=0")', against 11,727.9 s
    "FUGAKU-DEV-10": 1401.1,  # 124M, '1 ("retention_state=0")', against 1,489.7 s
}


def predicted(row_id: str) -> tuple[float, float]:
    """(measured, predicted) seconds per iteration of a validation row."""
    from llmsim import validation as v

    p = v.predict(next(r for r in v.load_runs() if r.id == row_id))
    return p.run.measured, p.predicted


@pytest.mark.parametrize("row", sorted(RETENTION_OFF_S))
def test_the_one_node_rows_are_within_20_percent_of_the_runs_without_core_retention(row):
    """llmsim's retention adds nothing to these rows (no wait reaches libomp's block time), so
    the like-for-like measurement of a row's configuration is the source's run with
    retention_state=0: DEV-6 10,978 s against 10,023.9 (+9.5 %),
    DEV-10 1,185 s against 1,401.1 (-15.4 %); the rows themselves are -6.4 and -20.4 %."""
    _, model = predicted(row)
    assert model == pytest.approx(RETENTION_OFF_S[row], rel=0.2)


def test_retention_explains_part_of_the_124m_nodes_gap_and_never_overshoots_it():
    """The source's retention difference on the 124M node (88.6 s) is part of the row's gap,
    not all of it: the run without retention is still slower than llmsim, and the default
    run slower again (share 0.29)."""
    measured, model = predicted("FUGAKU-DEV-10")
    off = RETENTION_OFF_S["FUGAKU-DEV-10"]
    assert model < off < measured
    assert 0.2 < (measured - off) / (measured - model) < 1.0


def test_the_1_3b_node_lies_between_its_runs_with_and_without_retention():
    """On the 1.3B node (checkpointed, PyTorch 1.7) llmsim's 10,978 s lies between the
    source's run without retention (10,023.9 s) and the row (11,727.9 s): what llmsim misses
    of the row (750 s) is less than the retention difference (1,704 s)."""
    measured, model = predicted("FUGAKU-DEV-6")
    assert RETENTION_OFF_S["FUGAKU-DEV-6"] < model < measured


def test_weights_on_one_cmg_cost_the_gemms_no_ring_bandwidth():
    """The rows' weights are first-touched by the main thread (normal_ on CPU is a serial
    loop in the runs' PyTorch 1.7), so they sit on one CMG. A GEMM of M tokens at R FLOP/s
    reads its K x N FP32 weight at 4KN / (2MKN / R) = 2R/M bytes/s, whatever K and N: at
    the catalog's third of peak 4.0 GB/s, and four times that if each CMG read it whole,
    against one ring segment's 128 GB/s (fugaku-cmg's fabric tier)."""
    chip = load_spec("accelerators", "a64fx")
    rate_flops = chip.peak_flops("fp32") * chip.gemm.peak_fraction
    tokens = 1024  # the rows' micro-batch of one 1,024-token sequence (2,048 at DEV-7's two)
    weight_bytes_per_s = 2.0 * rate_flops / tokens
    assert weight_bytes_per_s == pytest.approx(3.96e9, rel=0.01)
    (ring,) = load_spec("systems", "fugaku-cmg").node.fabric
    ring_bytes_per_s = ring.gbps_per_direction * 1e9
    assert 4 * weight_bytes_per_s < 0.15 * ring_bytes_per_s
    # Even at SSL2's best measured rate (0.90 of peak on 48 threads) the weights take a
    # tenth of a segment.
    assert 2.0 * chip.peak_flops("fp32") * 0.90 / tokens < 0.1 * ring_bytes_per_s


# --- the boost clock ------------------------------------------------------------------
BOOST = {"a64fx": "a64fx-boost", "a64fx-cmg": "a64fx-cmg-boost"}
CLOCK_RATIO = 2.2 / 2.0


@pytest.mark.parametrize("base", sorted(BOOST))
def test_the_boost_files_are_their_base_at_1_1_times_the_peaks(base):
    """Only the peaks follow the clock: the SSL2 curves are fractions of the threads' peak,
    the memory and page rates are kept (a64fx-boost.yaml's notes say why)."""
    normal, boost = load_spec("accelerators", base), load_spec("accelerators", BOOST[base])
    for dtype in ("fp16", "fp32", "fp64"):
        assert boost.peak_flops(dtype) == pytest.approx(normal.peak_flops(dtype) * CLOCK_RATIO)
    skip = {"name", "description", "dense_tflops", "sources", "notes"}
    kept = normal.model_dump(exclude=skip)
    assert boost.model_dump(exclude=skip) == kept
    assert {k: v for k, v in boost.sources.items() if k != "dense_tflops"} == {
        k: v for k, v in normal.sources.items() if k != "dense_tflops"}
    assert "freq=2200" in boost.sources["dense_tflops"] + boost.description


def step_s(row_id: str, boost: bool = False, allocator: str | None = None,
           retention: bool | None = None) -> float:
    """llmsim's step of a validation row's configuration, optionally at 2.2 GHz (the row's
    system with its device swapped for the boost file), with another allocator and with
    core retention set (the rows have it on)."""
    from llmsim import validation as v
    from llmsim.simulation import simulate
    from llmsim.validation.scenarios import scenario_mapping

    run = next(r for r in v.load_runs() if r.id == row_id)
    mapping: dict[str, Any] = dict(scenario_mapping(run))
    system = mapping["system"]
    if isinstance(system, str):
        system = read_yaml(catalog.path_of("systems", system))
    mapping["system"] = system = dict(system)
    if boost:
        system["node"] = {**system["node"],
                          "accelerator": BOOST[system["node"]["accelerator"]]}
    if retention is not None:
        system["retention_state"] = retention
    if allocator is not None:
        mapping["training"] = {**mapping["training"], "allocator": allocator}
    return simulate(load_scenario(mapping)).step_time_s


# fugaku_sweep.md (as above), PyTorch 1.7 unless said: the runs with the knobs the
# Fugaku-LLM production run set (2.2 GHz, retention_state=0) and tcmalloc preloaded.
TUNED_S = {
    "FUGAKU-DEV-12": 827.2,  # one process of 48 threads (the row: 976.2 s at the defaults)
    "FUGAKU-DEV-11": 522.7,  # four processes, one per CMG, DP 4 (the row: 721.7 s, glibc)
}


@pytest.mark.parametrize("row", sorted(TUNED_S))
def test_the_tuned_runs_of_pytorch_1_7_are_within_20_percent(row):
    """With the production run's knobs and tcmalloc (both runs without activation
    checkpointing: their printed TFLOPs are the formula's factor 3), llmsim gives 884.3 s
    (+6.9 %) for one process of 48 threads and 522.7 s for one process per CMG (the run that
    sets ``gemm.framework_share``, so that one is no check): the process layout costs 1.69x
    in llmsim against 1.58x measured (1.37x with the third of peak as the GEMMs' ceiling),
    so no unpriced NUMA cost of the 48-thread process is needed to reach it."""
    model = step_s(row, boost=True, allocator="caching", retention=False)
    assert model == pytest.approx(TUNED_S[row], rel=0.2)


# fugaku_sweep.md (as above), table 'PyTorch 1.10': 124M at DP 512 on 512 nodes, one
# process of 48 threads a node, glibc, retention on, two micro-batches of one sequence a
# rank, without checkpointing (printed 0.43 and 0.50 TFLOP/s a node: the formula's factor
# 3, 2 x 8.158e11 FLOP / 3.7 and / 3.2 s; factor 4 would print 0.59 and 0.68). Not rows,
# and not used to set 1.10's GEMM share (the tuned per-CMG run of 363.6 s is).
PYTORCH_1_10_512_NODES_S = {False: 3.7, True: 3.2}  # boost clock -> seconds a step


@pytest.mark.xfail(strict=True, reason=(
    "llmsim 1.788 s (2.0 GHz, -51.7 %) and 1.677 s (2.2 GHz, -47.6 %) at PyTorch 1.10's "
    "GEMM share (2.382 and 2.217 s, -35.6 and -30.7 %, at 1.7's): 1.72 s of llmsim's step "
    "is the node's compute and 0.06 s the exposed all-reduce, while the source's 1.10 node "
    "with glibc took 2.58 s for two micro-batches even with recompute (FUGAKU-DEV-9 / 512), "
    "so at least 1.1 s of the 512-node step is outside the one-node compute and unpriced"))
@pytest.mark.parametrize("boost", sorted(PYTORCH_1_10_512_NODES_S))
def test_the_pytorch_1_10_runs_on_512_nodes_are_within_20_percent(boost):
    """The check of 1.10's share on the sweep's 1.10 runs that did not set it: FUGAKU-DEV-9's
    scenario (PyTorch 1.10, 48 threads, glibc, its share by choice) without recompute, at
    DP 512 on 512 nodes."""
    from llmsim import validation as v
    from llmsim.simulation import simulate
    from llmsim.validation.scenarios import scenario_for

    row = scenario_for(next(r for r in v.load_runs() if r.id == "FUGAKU-DEV-9"))
    system = row.system
    if boost:
        share = system.node.accelerator.gemm.framework_share
        chip = load_spec("accelerators", "a64fx-boost")
        chip = chip.model_copy(update={"gemm": chip.gemm.model_copy(
            update={"framework_share": share})})
        node = system.node.model_copy(update={"accelerator": chip})
        system = system.model_copy(update={"node": node})
    scenario = row.model_copy(update={
        "nodes": 512, "system": system,
        "parallelism": row.parallelism.model_copy(update={"dp": 512, "recompute": "none"})})
    assert scenario.system.node.accelerator.gemm.framework_share == 0.4841
    assert simulate(scenario).step_time_s == pytest.approx(
        PYTORCH_1_10_512_NODES_S[boost], rel=0.2)


# The rows' configurations at 2.2 GHz with the other knobs at their defaults (fugaku_sweep.md).
BOOST_ONLY_S = {"FUGAKU-DEV-6": 10532.4, "FUGAKU-DEV-10": 1261.2}


@pytest.mark.parametrize("row", sorted(BOOST_ONLY_S))
def test_what_llmsim_misses_shrinks_faster_than_the_clock(row):
    """A 1.1x clock sped the source's runs up 1.114x (1.3B) and 1.181x (124M); llmsim's
    time, whose memory and page rates do not follow the core clock, 1.08x. So the time llmsim
    misses shrank 2.1x and 1.9x (GEMM share 0.3255; the 124M row without recompute): more
    than the clock, which an HBM2- or ring-bound cost (NUMA placement) could not do."""
    from llmsim import validation as v

    measured = next(r for r in v.load_runs() if r.id == row).measured
    normal, boost = step_s(row), step_s(row, boost=True)
    assert 1.0 < normal / boost < CLOCK_RATIO < measured / BOOST_ONLY_S[row]
    assert (measured - normal) / (BOOST_ONLY_S[row] - boost) > CLOCK_RATIO


def _one_node_file(tmp_path: Any) -> str:
    import yaml

    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({
        "name": "one-fugaku-node", "system": "fugaku", "nodes": 1,
        "model": {"name": "t", "layers": 2, "hidden": 768, "heads": 12, "ffn_hidden": 3072,
                  "vocab": 50304},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1},
        "training": {"global_batch": 2, "seq_len": 1024, "precision": "fp32",
                     "attention_kernel": "unfused", "tokens": 1e9},
    }))
    return str(path)


def test_llmsim_run_takes_the_boost_clock_as_a_device_override(tmp_path, capsys):
    """`--set system.node.accelerator=a64fx-boost` runs a Fugaku scenario at 2.2 GHz: the
    report names the device and the step is shorter, by less than the clock."""
    import re

    from test_cli import run_cli

    def step(out: str) -> float:
        match = re.search(r"step time\s*│\s*([\d,.]+) (m?s)", out)
        assert match, out
        value = float(match.group(1).replace(",", ""))
        return value / 1e3 if match.group(2) == "ms" else value

    scenario = _one_node_file(tmp_path)
    code, normal, err = run_cli(["run", scenario], capsys)
    assert code == 0, err
    code, boost, err = run_cli(
        ["run", scenario, "--set", "system.node.accelerator=a64fx-boost"], capsys)
    assert code == 0, err
    assert "a64fx-boost" in boost and "a64fx-boost" not in normal
    assert 1.0 < step(normal) / step(boost) <= CLOCK_RATIO + 1e-9
