"""What attention rate the NEMOLS rows imply (docs/validation.md, section 10): for each
row, llmsim's time in the attention kernels of the busiest device's compute stream, and
the factor on their rate that would make the step the measured one with every other op
at llmsim's price. An explanation of the rows' error, not a fit: nothing is changed.

Run: python benchmarks/nemols_attention_rate.py   (about 10 s on 2 cores)
"""

from __future__ import annotations

from llmsim import validation

ATTENTION_OPS = ("attn", "attn_bwd")
"""The fused attention kernels' ops (forward, backward) of a dense block."""


def main() -> None:
    print("| row | llmsim step s | measured step s | attention s | share | rate factor |")
    print("|---|---:|---:|---:|---:|---:|")
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
        print(f"| {run.id} | {step_s:.2f} | {measured_s:.2f} | {attention_s:.2f} | "
              f"{attention_s / step_s:.0%} | {factor:.2f} |")


if __name__ == "__main__":
    main()
