"""The kernels around a MoE layer's router that the router's own ops leave out.

llmsim prices a router as its gating GEMM and one top-k kernel (:mod:`llmsim.moe`). Two
things more run on the device each micro-batch, and in eager mode each of their kernels
is one dispatch of the host (:mod:`llmsim.costs.host_issue`):

- **The block input's gradient is a sum.** The router and the token permutation (and
  shared experts, where the model has them) all read the block's input, the second norm's
  output, so autograd adds their input gradients before the norm's backward: one
  element-wise kernel per extra reader, reading two gradients and writing one (3 passes).
- **The framework's bookkeeping** (``training.moe_router_kernels``, forward and backward
  counts): small kernels of no measurable traffic — a load-balancing loss, random logits
  for a benchmark, type casts — each priced as the device's gap per kernel
  (``kernel_launch_us``) and, eager, one host dispatch. The counts are read from a
  framework's code; none by default. Megatron-Core at 4415119414 (the Megatron-LM of
  Megatron-Bridge 26.04.01) with ``moe_router_fusion``, ``aux_loss`` balancing and
  ``moe_router_force_load_balancing``, BF16 router logits and the HybridEP dispatcher
  (the Qwen3 recipes) launches 8 in the forward — ``RandomSTE``'s ``logits.clone()`` and
  ``normal_()`` (moe_utils.py), ``fused_compute_score_for_moe_aux_loss``,
  ``routing_map.sum(dim=0)`` (``get_tokens_per_expert_and_token_count``),
  ``fused_moe_aux_loss``, ``aux_loss / coeff`` and the ``+=`` into the logging tracker
  (``save_to_aux_losses_tracker``), and ``token_probs.float()`` before HybridEP's dispatch
  (token_dispatcher.py ``_HybridEPManager.dispatch``) — and 6 in the backward:
  ``MoEAuxLossAutoScaler.backward``'s ``ones_like`` and scale, the two fused aux-loss
  backward kernels, the sum of the logits' two gradients (top-k and aux scores;
  ``RandomSTE`` passes its gradient through) and the probabilities' cast back to BF16.
  ``tokens_per_expert`` costs none: without ``num_permuted_tokens`` HybridEP copies it
  through pinned memory to the host (``dispatch_with_permute``, deep_ep/hybrid_ep_buffer.py
  of DeepEP's hybrid-ep branch), so its casts, sum and ``tolist()`` are host work.
  HybridEP's routing-map all-gather is priced with the dispatcher (:mod:`llmsim.moe`);
  left out: its ``metadata_preprocess_core`` kernel, issued from C++.
"""

from __future__ import annotations

from llmsim.ops import ComputeOp
from llmsim.specs import Model, Training
from llmsim.workload.layer import LayerBuilder
from llmsim.workload.step import Op


def with_router_kernels(moe_f: list[Op], moe_b: list[Op], builder: LayerBuilder,
                        model: Model, training: Training) -> tuple[list[Op], list[Op]]:
    """A MoE block's forward and input-gradient ops with the kernels of this module's
    docstring: the framework's bookkeeping after ``router_topk`` and before
    ``router_topk_bwd``, the input gradients' sums after the router's input gradient.
    A block without a router (one expert) is returned as it is."""
    names_f = [op.name for op in moe_f]
    names_b = [op.name for op in moe_b]
    if "router_topk" not in names_f or "router_dx" not in names_b:
        return moe_f, moe_b
    assert model.moe is not None
    fwd_n, bwd_n = training.moe_router_kernels
    fwd, bwd = list(moe_f), list(moe_b)
    if fwd_n:
        fwd.insert(names_f.index("router_topk") + 1,
                   ComputeOp("moe_router_kernels", "memory", "F", 0.0, 0.0, splits=fwd_n))
    readers = 2 + (1 if model.moe.shared_experts else 0)  # router, permutation, shared
    sums = [builder._mem(f"moe_input_grad_sum{i}" if i else "moe_input_grad_sum", "B",
                         builder.stream, 3) for i in range(readers - 1)]
    at = names_b.index("router_dx") + 1
    bwd[at:at] = sums
    if bwd_n:
        bwd.insert(names_b.index("router_topk_bwd"),
                   ComputeOp("moe_router_kernels_bwd", "memory", "B", 0.0, 0.0, splits=bwd_n))
    return fwd, bwd
