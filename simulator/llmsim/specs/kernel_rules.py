"""The rules between a model and the kernels a scenario says its framework runs
(``training.pointwise_ops``, ``training.rope``): each kernel chain prices one framework's
code, refused with one sentence naming the field, the value and the fix where the model
is not the one that code runs (checked when a
:class:`~llmsim.specs.scenario.Scenario` is made)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsim.specs.model import Model
    from llmsim.specs.training import Training


def check_kernel_choices(mdl: Model, trn: Training) -> None:
    """Raise ``ValueError`` for the first kernel choice ``mdl`` cannot run."""
    llama = (mdl.norm, mdl.position_embedding, mdl.activation) == ("rmsnorm", "rope", "swiglu")
    if trn.pointwise_ops == "hf_eager" and not llama:
        raise ValueError(
            f"training.pointwise_ops: hf_eager is Hugging Face LLaMA's RMSNorm, RoPE and "
            f"SwiGLU, but {mdl.name} has {mdl.norm}, {mdl.position_embedding} and "
            f"{mdl.activation}; set pointwise_ops to fused"
        )
    if trn.pointwise_ops == "hf_eager" and (mdl.mla is not None or mdl.moe is not None):
        raise ValueError(  # LlamaForCausalLM, transformers 4.31-4.35 (workload/hf_eager)
            f"training.pointwise_ops: hf_eager prices Hugging Face's LlamaForCausalLM, "
            f"which has {'no MLA' if mdl.mla else 'no experts'}, and {mdl.name} has "
            f"{'MLA' if mdl.mla else 'a mixture of experts'} (its own modeling code, not "
            "priced); set pointwise_ops to fused"
        )
    if trn.pointwise_ops == "hf_eager" and trn.rope == "complex":
        raise ValueError(
            "training.rope: complex with pointwise_ops: hf_eager, whose RoPE is Hugging "
            "Face's unfused rotate_half chain; remove rope or set it to unfused"
        )
    if trn.pointwise_ops == "eager_swiglu" and mdl.activation != "swiglu":
        raise ValueError(
            f"training.pointwise_ops: eager_swiglu is the SwiGLU as eager SiLU and "
            f"product kernels, but {mdl.name} has {mdl.activation}; set pointwise_ops "
            "to fused"
        )
