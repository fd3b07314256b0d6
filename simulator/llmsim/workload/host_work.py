"""Which ops the host runs Hugging Face's framework work before (``training.host_path:
hugging_face``): a reentrant checkpoint's backward matmul nodes and FSDP's hooks.

Measured on one H100 box (``benchmarks/results/h100-2026-11-27-hf-llama/cpu_profile``,
torch.profiler tables of transformers' ``LlamaForCausalLM`` at LLaMA-7B's shapes, 16
tokens, where the host sets the pace; docs/calibration.md, "A Hugging Face step on one
H100"):

* Under Hugging Face's gradient checkpointing (a reentrant ``torch.utils.checkpoint``
  around each decoder layer) the backward's ``MmBackward0`` nodes take 200 µs of the
  host's own time each against 11 µs in the plain step, with the same kernels below
  them: the time the autograd thread spends in the node while the checkpoint's re-run
  runs (its cause inside PyTorch is not identified). Every nn.Linear of the layer is one
  such node: Hugging Face's Llama keeps ``q_proj``, ``k_proj``, ``v_proj`` and
  ``o_proj`` apart, and its MLP's ``gate_proj``, ``up_proj`` and ``down_proj`` (llmsim
  fuses q/k/v into one ``qkv`` op and the gate with the up projection in ``mlp_up``, so
  those backward ops stand for 3 and 2 nodes; :data:`NODES`). The accelerator's
  ``host_ckpt_node_us`` prices each node; the op of the node's input gradient carries it.
* Under FSDP each ``FULL_SHARD`` unit (a decoder layer) runs ``_pre_forward`` and
  ``_post_forward`` around its forward and ``_pre_backward_hook`` and
  ``_post_backward_hook`` around its backward (``host_fsdp_forward_us``,
  ``host_fsdp_backward_us``), put before the unit's first op of the pass. Transformers
  5.17, which the board ran, checkpoints inside the FSDP unit, so a recompute runs no
  FSDP hook there (one ``_pre_forward`` a unit a step in the profile); with the
  transformers of 2023, which checkpoint around the FSDP unit, the recompute's call runs
  them again, which is not priced here.
"""

from __future__ import annotations

from dataclasses import replace

from llmsim.ops import ComputeOp
from llmsim.specs import Model, Parallelism, Training
from llmsim.workload.step import Op

NODES = {"qkv_dx": 3, "attn_proj_dx": 1, "mlp_down_dx": 1}
"""Backward matmul nodes of Hugging Face's Llama layer that each of llmsim's input-gradient
GEMMs stands for: ``q_proj``, ``k_proj`` and ``v_proj``; ``o_proj``; ``down_proj``
(``mlp_up_dx`` stands for the MLP's other matrices, :func:`nodes`)."""


def nodes(op: Op, model: Model) -> int:
    """Backward matmul nodes ``op`` stands for in Hugging Face's Llama layer (0 for an op
    that is not a layer's input-gradient GEMM)."""
    if not isinstance(op, ComputeOp) or op.kind != "gemm" or op.phase != "B":
        return 0
    if op.name == "mlp_up_dx":
        return model.mlp_matrices - 1  # gate_proj and up_proj (SwiGLU), or the one up
    return NODES.get(op.name, 0)


def apply_host_work(lists: tuple[list[Op], ...], model: Model, par: Parallelism,
                    training: Training) -> tuple[list[Op], ...]:
    """A block's (forward, recompute, backward, weight-gradient) op lists with the host work
    marked (module docstring): each backward matmul node under full recompute
    (``ComputeOp.ckpt_nodes``), and FSDP's hooks before the block's first forward and
    first backward op under ZeRO-3 (``ComputeOp.fsdp_hooks``). Unchanged unless
    ``training.host_path`` is ``hugging_face``."""
    if training.host_path != "hugging_face":
        return lists
    forward, recompute, backward, weight = (list(ops) for ops in lists)
    if par.recompute == "full":
        backward = [replace(op, ckpt_nodes=n) if (n := nodes(op, model)) else op
                    for op in backward]
    if par.zero == 3:
        for ops, hooks in ((forward, "forward"), (backward, "backward")):
            first = next((i for i, op in enumerate(ops) if isinstance(op, ComputeOp)), None)
            if first is not None:
                ops[first] = replace(ops[first], fsdp_hooks=hooks)
    return forward, recompute, backward, weight
