"""Workload graph: the ordered ops of one training step, per pipeline stage and chunk.

Every micro-batch of a chunk runs the same ops, so a chunk is described once by its
forward (F), input-gradient (B), weight-gradient (W) and recompute (R) op lists; the
schedule says in which order the micro-batches run them. Sizes are per device: matrices
are divided by the tensor-parallel degree ``t``. Shapes follow Megatron-LM's layer
(Shoeybi et al. 2019, Fig. 3; Narayanan et al. 2021 §3.1; Korthikanti et al. 2022 §4).

The package holds three parts, data flowing one way: :mod:`~llmsim.workload.layer` builds
the ops of one block (and the embedding and head), :mod:`~llmsim.workload.build` assembles
them into chunks and the step's traffic, and :mod:`~llmsim.workload.step` is the result,
the :class:`Workload` the engine replays, its gradient buckets in
:mod:`~llmsim.workload.grad_buckets`; :mod:`~llmsim.workload.fp8` sizes Transformer
Engine's FP8 bookkeeping (weight casts, amax-history updates) for both.
"""

from llmsim.workload.build import (
    FP8_LINEARS_PER_LAYER,
    Passes,
    PassOps,
    build_workload,
    chunk_extras,
    chunk_params,
    pass_ops,
    pp_message_bytes,
    shard_ranks,
    step_traffic,
)
from llmsim.workload.layer import LayerBuilder
from llmsim.workload.loss import cross_entropy_bytes_per_logit
from llmsim.workload.step import EXTRA_OP_PREFIXES, Chunk, Op, Workload

__all__ = [
    "EXTRA_OP_PREFIXES", "FP8_LINEARS_PER_LAYER", "Chunk", "LayerBuilder", "Op", "PassOps",
    "Passes", "Workload", "build_workload", "chunk_extras", "chunk_params",
    "cross_entropy_bytes_per_logit", "pass_ops", "pp_message_bytes", "shard_ranks",
    "step_traffic",
]
