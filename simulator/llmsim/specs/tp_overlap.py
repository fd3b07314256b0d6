"""Transformer Engine's overlap of a tensor-parallel GEMM with its transfer: one entry of
its userbuffers configuration (:attr:`llmsim.specs.Parallelism.tp_overlap_gemms`)."""

from __future__ import annotations

from typing import Literal

from pydantic import NonNegativeInt, PositiveInt

from llmsim.specs._base import Spec

__all__ = ["TpOverlapGemm", "TpOverlapGemmName"]

TpOverlapGemmName = Literal["qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad",
                            "fc1_fprop", "fc1_dgrad", "fc1_wgrad", "fc2_fprop", "fc2_dgrad"]
"""Transformer Engine's names of the userbuffers-overlapped GEMMs (``initialize_ub``)."""


class TpOverlapGemm(Spec):
    """How Transformer Engine overlaps one GEMM with its TP transfer: one entry of its
    userbuffers configuration (``ub_cfgs``; NeMo's ``tp_comm_overlap_cfg`` YAML)."""

    method: Literal["ring_exchange", "pipeline", "bulk"]
    """``ring_exchange``: the transfer by copy engines, the GEMM cut into ``tp`` chunks of
    the tokens (``tp/2`` with ``aggregate``); ``pipeline``: the GEMM cut into ``num_splits``
    chunks, each reduce-scattered by kernels on ``num_sm`` SMs while the next computes;
    ``bulk``: the whole GEMM beside a transfer on ``num_sm`` SMs."""
    num_sm: NonNegativeInt = 16
    """Compute units (SMs) the transfer's kernels hold (``pipeline`` and ``bulk``)."""
    num_splits: PositiveInt = 4
    """Chunks of a ``pipeline`` GEMM."""
    aggregate: bool = False
    """``ring_exchange``: two arriving chunks per GEMM, ``tp/2`` GEMMs of twice the rows."""
