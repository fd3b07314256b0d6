"""DeepSpeed's ``Experts`` loop over uneven token batches, as X-MoE runs its experts.

llmsim prices a MoE layer's expert GEMMs as grouped kernels: all ``E`` local experts' tiles
in one launch, one wave quantisation over all of them (:mod:`llmsim.moe`). DeepSpeed's
``Experts`` module instead calls its ``E`` expert MLPs one after another from Python. With
uneven token batches (``is_uneven_tokens``, set by X-MoE's ``--use-uneven-all-to-all``),
read in Supercomputing-System-AI-Lab/X-MoE at 33c69c95 (``deepspeed/moe/experts.py``,
``Experts.forward``; ``deepspeed/moe/moe_v2.py``, ``MOEv2Layer.forward``; the same files at
b0283d5c), per micro-batch and MoE layer:

* the received rows are split per source rank (views); for each local expert ``i``,
  ``torch.cat(split_chunks[i::E])`` copies its rows from every source into one tensor, and
  ``expert(chunk)`` runs its MLP: one GEMM, bias and activation kernel each, an expert at a
  time ("a sequential-GEMM path that launches one GEMM per local expert on uneven token
  batches", the authors' blog, ``x-moe-blog/README.md`` at e28d86b4);
* ``torch.cat(expert_outputs)`` copies the outputs into one tensor;
* ``MOEv2Layer`` re-interleaves them by source rank before the combine all-to-all:
  ``torch.split`` (views), one ``torch.cat`` per source of its experts' pieces and a
  ``torch.cat`` of those, two more copies.

So the forward copies the routed rows ``R`` (this rank's, ``R·h`` values) four times. In
the backward, autograd's ``cat`` gives its input gradients as views (``narrow``) and
``split`` concatenates its outputs' gradients, one copy each for the interleave's split
and the input's split: two more. Each copy reads and writes ``R·h`` values. The expert
GEMMs are priced as ``E`` GEMMs of the mean rows run in order on one stream (a grouped
op of ``E`` matrices becomes one of ``E·M`` rows in ``E`` splits, :func:`gemm_math_s`
of :mod:`llmsim.costs.compute`), each with its own launch; the activation kernel
(``expert_act``) is launched once per expert. Left out: the uneven rows themselves (every
expert takes the mean rows of the busiest rank: an expert with more rows than another
costs more waves, which the mean does not show), and the bias kernels of each expert's
linear layers (bias-add and bias-gradient, priced with the activation's traffic).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from llmsim.moe_host import EXPERT_GEMMS
from llmsim.ops import ComputeOp

if TYPE_CHECKING:
    from llmsim.moe import MoeBlock
    from llmsim.workload import Op

EXPERT_MEMORY = frozenset({"expert_act", "expert_act_bwd"})
"""An expert MLP's memory-bound kernels that the loop launches once per local expert."""

FORWARD_COPIES = 4
"""Copies of the routed rows in the forward: the per-expert gather, the outputs'
concatenation and the interleave's two (module docstring)."""
BACKWARD_COPIES = 2
"""Copies of the routed rows in the backward: the gradients of the interleave's split and
of the input's split (module docstring)."""


def one_per_expert(op: Op, local: int) -> Op:
    """``op`` as the loop runs it: a grouped expert GEMM of ``local`` matrices as ``local``
    GEMMs in order (one of ``local·M`` rows in ``local`` splits: the same FLOPs and bytes,
    each split its own waves and launch), an expert MLP's memory-bound kernel launched
    ``local`` times; any other op as it is."""
    if not isinstance(op, ComputeOp) or local == 1:
        return op
    if op.kind == "gemm" and op.name in EXPERT_GEMMS and op.mnk is not None:
        m, n, k = op.mnk
        return replace(op, mnk=(m * op.batch, n, k), batch=1, splits=op.batch * op.splits)
    if op.kind == "memory" and op.name in EXPERT_MEMORY:
        return replace(op, splits=local)
    return op


def _copy(block: MoeBlock, name: str, phase: str, copies: int) -> ComputeOp:
    """``copies`` copies of this rank's routed rows (``R·h`` values read and written each),
    as one memory-bound op of ``copies`` kernels."""
    elements = block.rows * block.b.m.hidden
    return replace(block.b._mem(name, phase, elements * copies, 2), splits=copies)


def _insert(ops: list[Op], ops_new: list[Op], before: str) -> list[Op]:
    """``ops`` with ``ops_new`` placed before the first op named ``before``."""
    i = next(j for j, op in enumerate(ops) if op.name == before)
    return ops[:i] + ops_new + ops[i:]


def _after(ops: list[Op], ops_new: list[Op], after: str) -> list[Op]:
    """``ops`` with ``ops_new`` placed after the first op named ``after``."""
    i = next(j for j, op in enumerate(ops) if op.name == after) + 1
    return ops[:i] + ops_new + ops[i:]


def with_expert_loop(block: MoeBlock, fwd: list[Op], bwd: list[Op],
                     wgt: list[Op]) -> tuple[list[Op], list[Op], list[Op]]:
    """A MoE block's forward, input-gradient and weight-gradient ops as
    ``training.expert_loop`` runs them: unchanged for ``grouped``; for ``deepspeed_uneven``
    each expert op one per local expert (:func:`one_per_expert`), the gather of each
    expert's rows before its first GEMM, the outputs' concatenation and the interleave
    after its last, and in the backward the two split gradients' concatenations beside
    the same GEMMs (module docstring)."""
    if block.b.trn.expert_loop == "grouped":
        return fwd, bwd, wgt
    local = block.local
    fwd, bwd, wgt = ([one_per_expert(op, local) for op in ops] for ops in (fwd, bwd, wgt))
    gather_f = _copy(block, "moe_expert_gather", "F", 1)
    concat_f = _copy(block, "moe_expert_concat", "F", FORWARD_COPIES - 1)
    fwd = _after(_insert(fwd, [gather_f], "expert_up"), [concat_f], "expert_down")
    interleave_b = _copy(block, "moe_interleave_bwd", "B", 1)
    gather_b = _copy(block, "moe_expert_gather_bwd", "B", BACKWARD_COPIES - 1)
    bwd = _after(_insert(bwd, [interleave_b], "expert_down_dx"), [gather_b], "expert_up_dx")
    return fwd, bwd, wgt
