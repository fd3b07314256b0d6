"""Print the H100 catalog's measured attention tables (hardware/accelerators/
h100-sxm5-80gb.yaml) from attention.csv beside this file: per backend, the causal rows
[heads, KV heads, sequence, head dim, forward, backward TFLOP/s] and the non-causal blocks
[heads, KV heads, q tokens, kv tokens, head dim, forward, backward TFLOP/s]. The forward
rate is the file's; the backward is 2.5 forward FLOPs over the forward+backward time less
the forward's. Run: python benchmarks/results/h100-2026-11-27/catalog_rows.py"""

import csv
from pathlib import Path

BWD_OVER_FWD = 2.5


def tables(path: Path) -> dict[tuple[str, bool], list[list[float]]]:
    """(backend, causal) → catalog rows."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if not line.startswith("#")]
    times: dict[tuple, dict[str, float]] = {}
    for r in csv.DictReader(lines):
        key = (r["backend"], r["causal"] == "1", int(r["heads"]), int(r["kv_heads"]),
               int(r["q_tokens"]), int(r["kv_tokens"]), int(r["head_dim"]))
        times.setdefault(key, {})[r["pass"]] = float(r["time_us"])
        if r["pass"] == "fwd":
            times[key]["tflops"] = float(r["tflops"])
    out: dict[tuple[str, bool], list[list[float]]] = {}
    for (backend, causal, h, kv, sq, skv, d), t in times.items():
        if "fwd" not in t or "fwd_bwd" not in t:
            continue
        flops = 4.0 * h * sq * skv * d / (2 if causal else 1)
        bwd = BWD_OVER_FWD * flops / ((t["fwd_bwd"] - t["fwd"]) * 1e-6) / 1e12
        shape = [h, kv, sq, d] if causal else [h, kv, sq, skv, d]
        out.setdefault((backend, causal), []).append([*shape, round(t["tflops"], 1),
                                                      round(bwd, 1)])
    return out


if __name__ == "__main__":
    for (backend, causal), rows in sorted(tables(Path(__file__).with_name("attention.csv"))
                                          .items()):
        field = f"{backend}_attention{'' if causal else '_blocks'}_measured"
        print(f"{field}:")
        for row in sorted(rows, key=lambda r: (r[2:-2], r[0], -r[1])):
            print(f"  - {row}")
