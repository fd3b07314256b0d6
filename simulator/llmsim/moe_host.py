"""The host's work of a MoE layer's experts as Transformer Engine's ``GroupedLinear`` issues
it: kernels launched one local expert at a time from a C++ loop inside one call.

Read in Transformer Engine release_v2.16 (``transformer_engine/pytorch/module/
grouped_linear.py``, ``csrc/extensions/cast.cpp``, ``common/gemm/cublaslt_gemm.cu``) with
Megatron-Core 4415119414 (``moe/experts.py``: ``TEGroupedMLP`` runs ``linear_fc1`` and
``linear_fc2``, two ``GroupedLinear`` modules of ``E`` local experts each), the versions of
Megatron-Bridge 26.04. Per ``GroupedLinear`` and micro-batch, what scales with ``E``:

forward
    ``tex.split_quantize`` of the input, one C++ call that quantises each expert's row block
    with its own quantizer (current scaling: zero-fill, amax, scale and cast-transpose, 4
    kernels an expert, :func:`llmsim.moe_fp8.split_quantize_kernels`; delayed scaling one
    fused kernel for all); ``general_grouped_gemm``, one C++ call whose
    ``multi_stream_cublas_gemm`` builds the cuBLASLt descriptors, asks the heuristic and
    launches one GEMM per expert on 4 streams. Python loops over the ``E`` quantizers
    (``set_usage``), weights (``quantize_weight``: the FP8 weights are cached after the first
    micro-batch, ``is_first_microbatch`` from Megatron-Core's ``set_is_first_microbatch``)
    and saved tensors (``prepare_for_saving``) launch nothing.
backward
    ``tex.split_quantize`` of the output gradient (the same kernels), the input gradient's
    grouped GEMM and the weight gradient's (``E`` cuBLAS GEMMs each), and Python loops over
    the ``E`` main gradients (``main_grad_funcs``, ``handle_custom_ddp_from_mcore``) that
    launch nothing.

What does not scale with ``E``: each call's own dispatch (the op's host dispatch, at the
host path's interval, :mod:`llmsim.costs.host_issue`), Megatron-Core's ``tokens_per_expert
.tolist()`` (HybridEP's pinned host copy; the all-to-all dispatcher's counts are read at its
own sync), the activation, and the layer's router, permutation and dispatch.

So, with ``training.expert_host_loop``, each of those C++ loops' kernels beyond the call's
first costs the host one launch (``ComputeOp.host_loop_kernels``, priced at
:attr:`llmsim.costs.host_issue.HostIssue.loop_interval_s`). Left out: the Python loops above
(no kernel; Python statements, not measured), the cuBLAS multi-stream events
(``cudaEventRecord`` / ``cudaStreamWaitEvent``, 1 + 3·min(4, E) a call) and the first micro-batch's
per-expert weight quantisation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from llmsim.moe_fp8 import split_quantize_kernels
from llmsim.ops import ComputeOp

if TYPE_CHECKING:
    from llmsim.moe import MoeBlock
    from llmsim.workload import Op

EXPERT_GEMMS = frozenset({"expert_up", "expert_down", "expert_down_dx", "expert_up_dx",
                          "expert_down_dw", "expert_up_dw"})
"""The grouped expert GEMMs of a MoE block (:mod:`llmsim.moe`): one cuBLAS GEMM per local
expert each, launched from ``multi_stream_cublas_gemm``'s loop."""

Scaling = Literal["delayed", "current"]


def loop_kernels(op: ComputeOp, local: int) -> int:
    """Kernels a ``GroupedLinear`` C++ loop launches inside ``op`` beyond its host calls: a
    grouped expert GEMM's ``local − 1`` (one cuBLAS GEMM an expert, the first with the
    call), an expert operand's split quantisation its kernels less its calls; 0 otherwise."""
    if op.kind == "gemm" and op.name in EXPERT_GEMMS:
        return local - 1
    if op.host_calls and op.name.startswith(("fp8_amax_expert_", "fp8_cast_expert_")):
        return op.splits - op.host_calls
    return 0


def with_loop_kernels(ops: list[Op], local: int) -> list[Op]:
    """``ops`` with each grouped expert op's loop kernels declared (:func:`loop_kernels`);
    the others as they are."""
    out: list[Op] = []
    for op in ops:
        n = loop_kernels(op, local) if isinstance(op, ComputeOp) else 0
        out.append(replace(op, host_loop_kernels=n) if n else op)
    return out


def grouped_linear_launches(local: int, scaling: Scaling | None,
                            phase: Literal["F", "B"]) -> tuple[int, int]:
    """Host dispatches and loop launches of one ``GroupedLinear`` pass of ``local`` experts,
    as (calls, loop kernels); ``scaling`` None: BF16, nothing quantised. Forward: the
    input's split quantisation (current scaling: 2 calls for ``4E`` kernels; delayed: one
    call, one kernel) and the grouped GEMM (1 call, ``E`` GEMMs). Backward: the output
    gradient's quantisation and the input- and weight-gradient GEMMs. Current scaling gives
    (3, 5E − 3) forward and (4, 6E − 4) backward."""
    gemms = 1 if phase == "F" else 2
    calls, loop = gemms, gemms * (local - 1)
    if scaling is not None:
        amax, cast = split_quantize_kernels(local, scaling)
        quantize_calls = (1 if amax else 0) + 1
        calls += quantize_calls
        loop += amax + cast - quantize_calls
    return calls, loop


def block_ops(block: MoeBlock) -> tuple[list[Op], list[Op], list[Op]]:
    """A MoE block's forward, input-gradient and weight-gradient ops
    (:meth:`llmsim.moe.MoeBlock.ops`), each grouped expert op with its loop kernels declared
    where the framework launches them from a host loop (``training.expert_host_loop``)."""
    fwd, bwd, wgt = block.ops()
    if not block.b.trn.expert_host_loop:
        return fwd, bwd, wgt
    return (with_loop_kernels(fwd, block.local), with_loop_kernels(bwd, block.local),
            with_loop_kernels(wgt, block.local))
