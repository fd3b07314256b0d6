"""Overlapped forward-backward pairs: DualPipe's "F&B" (DeepSeek-V3 report §3.2.1,
Figure 4; deepseek-ai/DualPipe ``_forward_backward_chunk``).

DualPipe runs a forward chunk of one micro-batch and a backward chunk of another as one
pair, split into attention, dispatch, MLP and combine (the backward's also into input
and weight gradients) and interleaved so that the all-to-alls of each run while the
other computes. With ``parallelism.moe_a2a_overlap`` under a schedule that names its
pairs (:attr:`llmsim.schedules.ScheduleInfo.overlapped_pairs`) the engine prices each
pass of a pair with its all-to-alls cut to what the partner's computation does not hide:

* the forward ``F`` keeps ``max(0, a_F − c_BW)`` of its all-to-alls ``a_F``, ``c_BW``
  being the partner's backward and weight-gradient passes without their all-to-alls;
* the backward ``B`` keeps ``max(0, a_B − c_F)``, ``c_F`` the partner forward's.

The pair then takes ``c_F + c_BW + max(0, a_F − c_BW) + max(0, a_B − c_F)``
(``tests/test_moe_dualpipe.py`` checks it): each all-to-all hidden only behind the other
chunk's computation, never behind its own. The passes outside pairs (DualPipe's warm-up
and cool-down, steps 1–3 and 6–8) keep their all-to-alls whole. Not modelled: the SMs
the all-to-all kernels hold beside the computation (20 of the H800's 132, §3.2.2), and
any order within the pair that leaves an all-to-all waiting for its own chunk's
computation.
"""

from __future__ import annotations

from dataclasses import replace

from llmsim.blocks import Block
from llmsim.schedules import SCHEDULES, Action
from llmsim.workload import Workload

PassKey = tuple[int, str, int, int]
"""(stage, pass kind "F"/"B", micro-batch, chunk) of one pipeline action."""


def paired_kinds(schedule: list[list[Action]], schedule_name: str,
                 work: Workload) -> dict[PassKey, str]:
    """The block kind of every pass that runs in an overlapped pair: ``F&c`` for a forward
    whose partner is a backward of chunk ``c``, ``B&c`` for a backward whose partner is a
    forward of chunk ``c``; empty when the workload's pairs are not overlapped
    (:attr:`Workload.overlapped_pairs`) or the schedule has none."""
    info = SCHEDULES.get(schedule_name)
    if not work.overlapped_pairs or info is None or info.overlapped_pairs is None:
        return {}
    kinds: dict[PassKey, str] = {}
    for actions in schedule:
        for i, j in info.overlapped_pairs(actions):
            f, b = actions[i], actions[j]
            kinds[(f.stage, "F", f.microbatch, f.chunk)] = f"F&{b.chunk}"
            kinds[(b.stage, "B", b.microbatch, b.chunk)] = f"B&{f.chunk}"
    return kinds


def computation_s(*blocks: Block) -> float:
    """Seconds of ``blocks`` besides their all-to-alls (compute, TP and CP time)."""
    return sum(b.duration_s - b.a2a_s for b in blocks)


def beside_partner(own: Block, partner_s: float) -> Block:
    """``own`` with its all-to-alls (the ``ep`` spans) scaled down to what ``partner_s``
    seconds of the partner's computation leave exposed, ``max(0, a − partner_s)``; the
    other spans as they were, laid out back to back again."""
    if own.a2a_s <= 0:
        return own
    exposed_s = max(0.0, own.a2a_s - partner_s)
    scale = exposed_s / own.a2a_s
    spans, t = [], 0.0
    for span in own.spans:
        duration_s = span.duration_s * scale if span.stream == "ep" else span.duration_s
        spans.append(span._replace(offset_s=t, duration_s=duration_s))
        t += duration_s
    return replace(own, spans=tuple(spans), duration_s=t, a2a_s=exposed_s)
