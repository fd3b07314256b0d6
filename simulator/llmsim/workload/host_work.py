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
  them again (``parallelism.regather_for_recompute``: the recompute's first op carries a
  forward's hooks), and a unit called twice a pass (``parallelism.gathers_per_call`` 2,
  DistFlashAttn's patch: its attention's projections, then ``o_proj`` and its
  feed-forward) runs them at each call (:data:`SECOND_CALL`).
* ``training.host_path: modules`` takes a host time per kernel measured on a step with one
  forward and one backward hook set a unit (the profile's): it marks only the hooks beyond
  those, each recompute call's and each second call's.
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


SECOND_CALL = {"forward": "attn_proj", "backward": "qkv_dx"}
"""Where a unit's second call's FSDP hooks run under DistFlashAttn's patch
(``lightseq_ckpt_monkey_patch.py`` at 135d8d2: ``compute_attn_only`` returns q, k and v
before the attention, ``compute_ffn_only`` starts at ``o_proj``): before ``attn_proj`` in a
forward or recompute, and in the backward when q, k and v get their gradients (the
attention call's pre-backward hook), before ``qkv_dx``."""


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
    marked (module docstring): under ``hugging_face`` each backward matmul node under full
    recompute (``ComputeOp.ckpt_nodes``) and FSDP's hooks of every call of a ZeRO-3 unit
    (``ComputeOp.fsdp_hooks``); under ``modules`` the hooks beyond one forward and one
    backward set a unit. Unchanged on the other paths."""
    if training.host_path not in ("hugging_face", "modules"):
        return lists
    forward, recompute, backward, weight = (list(ops) for ops in lists)
    every = training.host_path == "hugging_face"
    if every and par.recompute == "full":
        backward = [replace(op, ckpt_nodes=n) if (n := nodes(op, model)) else op
                    for op in backward]
    if par.zero != 3:
        return forward, recompute, backward, weight
    second = par.gathers_per_call > 1
    recomputed = par.regather_for_recompute and par.recompute in ("full", "full_keep_attention")
    passes = [(forward, "forward", every), (backward, "backward", every)]
    if recomputed:  # a checkpoint around the unit: the recompute calls it again
        passes.append((recompute, "forward", True))
    for ops, hooks, first in passes:
        _mark(ops, hooks, second, first)
    return forward, recompute, backward, weight


def _mark(ops: list[Op], hooks: str, second: bool, first: bool) -> None:
    """Mark FSDP's ``hooks`` before the first compute op of ``ops`` (``first``) and, with a
    second call, before that call's first op (:data:`SECOND_CALL`), in place."""
    at = [i for i, op in enumerate(ops) if isinstance(op, ComputeOp)][:1] if first else []
    if second:
        at += [i for i, op in enumerate(ops)
               if isinstance(op, ComputeOp) and op.name == SECOND_CALL[hooks]][:1]
    for i in at:
        ops[i] = replace(ops[i], fsdp_hooks=hooks)
