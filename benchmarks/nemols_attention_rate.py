"""What attention rate the NEMOLS rows imply (docs/validation.md, section 10): for each
row, llmsim's time in the attention kernels of the busiest device's compute stream, and
the factor on their rate that would make the step the measured one with every other op
at llmsim's price. An explanation of the rows' error, not a fit: nothing is changed.

Run: python benchmarks/nemols_attention_rate.py   (about 10 s on 2 cores)

With ``--measured attention.csv`` (the table of ``time_attention.py``: backend, pass,
causal, heads, kv_heads, q_tokens, kv_tokens, head_dim, ..., tflops; the FLOPs counted
as llmsim executes them, a causal kernel half its square, the backward 2.5x the forward)
it also prices each row's attention at the measured forward+backward rate of each
backend at the kernels the ring really runs on one device (:func:`llmsim.context.ring_blocks`:
a causal diagonal and ``cp - 1`` full rectangles, over every rank of the ring; the
heads per device ``heads / tp``, or the nearest measured count where that one was not
measured), and gives the step time error that would result with every other op at
llmsim's price (llmsim's attention time taken to run at the measured rate of the row's
own kernel, ``training.attention_kernel``, from which the catalog prices it).
"""

from __future__ import annotations

import argparse
import csv

from llmsim import validation
from llmsim.context import ring_blocks

ATTENTION_OPS = ("attn", "attn_bwd")
"""The fused attention kernels' ops (forward, backward) of a dense block."""


def measured_rates(path: str) -> dict[tuple[str, bool, int, int, int], float]:
    """Forward+backward TFLOP/s by (backend, causal, heads, query tokens, key tokens), MHA
    rows of head dimension 128."""
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(r["backend"], r["causal"] == "1", int(r["heads"]), int(r["q_tokens"]),
                 int(r["kv_tokens"])): float(r["tflops"])
                for r in rows if r["pass"] == "fwd_bwd" and r["heads"] == r["kv_heads"]
                and r["head_dim"] == "128"}


def ring_rate(rates: dict, backend: str, heads: int, seq_len: int, cp: int) -> tuple[float, bool]:
    """Forward+backward TFLOP/s of a ring's kernels on one device, their FLOP-weighted
    harmonic mean over every rank's blocks, and whether a head count was substituted."""
    measured_heads = sorted({k[2] for k in rates if k[0] == backend})
    inverse, area, substituted = 0.0, 0.0, False
    for rank in range(cp):
        for b in ring_blocks(seq_len, cp, rank):
            shape = (b.causal, b.q_tokens, b.kv_tokens)
            have = [h for h in measured_heads if (backend, *shape[:1], h, *shape[1:]) in rates]
            h = min(have, key=lambda n: (abs(n - heads), -n))
            substituted |= h != heads
            inverse += b.executed_area / rates[(backend, b.causal, h, *shape[1:])]
            area += b.executed_area
    return area / inverse, substituted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", help="attention.csv of time_attention.py")
    args = ap.parse_args()
    rates = measured_rates(args.measured) if args.measured else None
    extra = (" cudnn TF/s | error at it | flash TF/s | error at it |" if rates else "")
    print("| row | llmsim step s | measured step s | attention s | share | rate factor |" + extra)
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" * 4 if rates else ""))
    for run in validation.load_runs("NEMOLS"):
        p = validation.predict(run)
        frame = p.result.to_dataframe()
        ops = frame[(frame.device == 0) & (frame.stream == "compute")
                    & frame.name.isin(ATTENTION_OPS)]
        attention_s = float(ops.duration_s.sum())
        step_s = p.result.step_time_s
        # a TFLOP/s row: the measured step is llmsim's scaled by predicted / measured
        measured_s = step_s * p.predicted / run.measured
        factor = attention_s / (attention_s + measured_s - step_s)
        cells = ""
        if rates:
            scenario = p.result.scenario
            heads = scenario.model.heads // scenario.parallelism.tp
            # llmsim prices the row's own kernel from these measurements (the catalog's
            # *_attention_measured tables), so its attention time stands for that rate
            llmsim_tflops, _ = ring_rate(rates, scenario.training.attention_kernel, heads,
                                         scenario.training.seq_len, scenario.parallelism.cp)
            for backend in ("cudnn", "flash"):
                tflops, sub = ring_rate(rates, backend, heads, scenario.training.seq_len,
                                        scenario.parallelism.cp)
                new_s = step_s - attention_s + attention_s * llmsim_tflops / tflops
                cells += (f" {tflops:.0f}{'*' if sub else ''} | "
                          f"{(new_s / measured_s - 1) * 100:+.1f} % |")
        print(f"| {run.id} | {step_s:.2f} | {measured_s:.2f} | {attention_s:.2f} | "
              f"{attention_s / step_s:.0%} | {factor:.2f} |" + cells)


if __name__ == "__main__":
    main()
