"""Where DeepSpeed-MoE's two A100 rows miss time, beside the A100 rows llmsim prices
with the same kernels (docs/validation.md, section 10, "Looked at again in session s13").

    python benchmarks/dsmoe_gap.py            # DSMOE22-01, -02 and their comparison rows

Prints two Markdown tables. The first is each row's step by mechanism, in per cent, from
``benchmarks/mi250x_decomposition.py``'s decomposition (which prices any row; its command
line takes MI250X rows only): the rows beside DSMOE22 are Megatron-LM's 8B of hidden 4,096
at TP 8 (MEGREADME-2009-A100-4 and -DP-4, each GPU's GEMMs as wide as DSMOE22-02's) and
BLOOM-01 (Megatron-DeepSpeed in DeepSpeed's PipelineEngine). The second is what the
measured step would need of llmsim's parts: the missing seconds a step, a micro-batch and a
sequence, and the factor on the compute alone (communication, optimizer and bubble as
priced) and on the whole step. About 5 s a row on one core.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from llmsim.validation import load_runs, scenario_for

ROWS = ("DSMOE22-01", "DSMOE22-02", "MEGREADME-2009-A100-4", "MEGREADME-2009-A100DP-4",
        "BLOOM-01")
"""The two DeepSpeed-MoE rows, then the A100 step-time rows they are compared with."""


def _decomposition_module():
    """``benchmarks/mi250x_decomposition.py``, loaded from beside this file."""
    path = Path(__file__).with_name("mi250x_decomposition.py")
    spec = importlib.util.spec_from_file_location("mi250x_decomposition", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gap_table(rows, runs) -> str:
    """What each row's measured step needs of llmsim's parts, as one Markdown table."""
    lines = ["| row | measured s | llmsim s | missing s | per micro-batch ms "
             "| per sequence ms | compute × (rest as priced) | step × |",
             "|---|" + "---:|" * 7]
    for d in rows:
        sc = scenario_for(runs[d.id])
        missing = d.measured_s - d.step_s
        rest = d.step_s - d.compute_s
        lines.append(
            f"| {d.id} | {d.measured_s:,.3f} | {d.step_s:,.3f} | {missing:,.3f} | "
            f"{1e3 * missing / sc.micro_batches:,.0f} | "
            f"{1e3 * missing / (sc.micro_batches * sc.parallelism.micro_batch):,.0f} | "
            f"{(d.measured_s - rest) / d.compute_s:.2f} | {d.measured_s / d.step_s:.2f} |")
    return "\n".join(lines)


def main() -> int:
    """Print both tables for :data:`ROWS`."""
    module = _decomposition_module()
    runs = {r.id: r for r in load_runs()}
    rows = [module.decompose(runs[i]) for i in ROWS]
    print(module.shares_table(rows))
    print()
    print(gap_table(rows, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
