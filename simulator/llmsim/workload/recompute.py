"""What a recompute runs again in the backward: a block's forward ops as phase R ops,
all of them (``parallelism.recompute: full``) or the named ones of a selective recompute."""

from __future__ import annotations

from llmsim.workload.layer import _as_phase
from llmsim.workload.step import Op

NORMS_AND_UP_PROJECTIONS = frozenset({"ln1", "ln2", "mla_q_norm", "mla_kv_norm", "mla_q_up",
                                      "mla_kv_up"})
"""The forward ops ``parallelism.recompute_norms_and_up_proj`` runs again in the backward
(DeepSeek-V3 report §3.2.3): the block's two RMSNorms, MLA's latent norms and its
up-projections."""
EXPERT_ACTIVATIONS = frozenset({"expert_act", "shared_act"})
"""The forward ops ``training.fp8_activation_cache`` runs again in the backward
(DeepSeek-V3 report §3.3.3): the routed and shared experts' activations (SwiGLU), whose
inputs are cached in FP8 and outputs not kept."""


def recomputed(forward: list[Op], names: frozenset[str] | None = None) -> list[Op]:
    """The ops of ``forward`` named in ``names`` (all of them without ``names``: a full
    recompute), in order, as recompute (phase R) ops."""
    return [_as_phase(op, "R") for op in forward if names is None or op.name in names]
