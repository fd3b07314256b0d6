"""DeepSpeed ZeRO-3's persistent parameters and their gather after the optimizer step
(``parallelism.persistent_regather``).

DeepSpeed's ZeRO-3 keeps every parameter of fewer than ``stage3_param_persistence_threshold``
elements (10⁵ by default, ``deepspeed/runtime/zero/constants.py``) resident: the forward's
per-module fetch never releases them (``ds_persist``). In v0.3.13 to v0.4.0 (March to June
2021) the end of the backward still partitions them with the rest
(``stage3.py``: ``backward`` → ``_partition_all_parameters``), and the optimizer step gathers
them back in one call (``_post_step`` → ``persistent_parameters[0].all_gather(...)`` →
``partition_parameters.py`` ``_allgather_params``):

* a flat buffer of ``Σ shard · dp`` elements (``torch.empty``), its tensor list built by a
  loop over the ranks (``narrow`` each), one tensor-list ``all_gather`` (PyTorch gathers into
  its own flat buffer and copies each rank's slice out, dp copies);
* then, for each persistent parameter and each rank ``i`` whose slice starts inside it
  (``i · shard < numel``, the shard ``⌈numel / dp⌉`` elements after DeepSpeed pads the
  parameter to a multiple of dp), ``replicated.view(-1).narrow(...).copy_(partitions[i]
  .narrow(...))``: one device copy per (parameter, rank), issued from Python.

That loop runs on the host with nothing else queued (the step's last work; the next
forward follows it), so each copy costs a kernel launch and the loop's own host time.
With 1,536 ranks and 770 persistent tensors (GPT-3 175B: two layer norms' weights and
biases and four biases per layer) it issues 1.18 million copies every step.
"""

from __future__ import annotations

import math

from llmsim.ops import CommOp
from llmsim.specs import Model

PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold``'s default, elements: a parameter smaller than
this stays resident (DeepSpeed v0.3.13–v0.4.0, ``ZERO_OPTIMIZATION_PARAM_PERSISTENCE_
THRESHOLD_DEFAULT = 100000`` in ``deepspeed/runtime/zero/constants.py``)."""


def persistent_elements(model: Model, tp: int, layers: int, last: bool) -> tuple[int, ...]:
    """Elements of each persistent parameter tensor of a chunk of ``layers`` layers on one
    tensor-parallel rank (the final norm's too on the ``last`` chunk), in Megatron-LM's
    layout (:func:`llmsim.params.param_tensors`): per layer two norms (weight, and bias
    for a layer norm) of ``hidden`` elements, and with ``model.bias`` the biases of the
    QKV projection (split over ``tp``), of the attention output and of the MLP's down
    projection (``hidden``, replicated) and of its up projection (split over ``tp``; gate
    and up together when gated). Only tensors below :data:`PERSISTENCE_THRESHOLD` count.
    """
    h = model.hidden
    norm = (h, h) if model.norm == "layernorm" else (h,)
    up = model.ffn_hidden * (2 if model.activation == "swiglu" else 1)
    biases = ((model.heads * model.head_dim + 2 * model.kv_dim) // tp, h, up // tp, h) \
        if model.bias else ()
    per_layer = tuple(e for e in (*norm, *norm, *biases) if e < PERSISTENCE_THRESHOLD)
    final = tuple(e for e in norm if e < PERSISTENCE_THRESHOLD) if last else ()
    return per_layer * layers + final


def slice_copies(elements: int, ranks: int) -> int:
    """Copies ``_allgather_params`` issues for one parameter of ``elements`` over ``ranks``:
    the ranks whose shard of ``⌈elements / ranks⌉`` starts inside the parameter,
    ``⌈elements / shard⌉`` (all ``ranks`` when ``elements`` is a multiple of them)."""
    shard = math.ceil(elements / ranks)
    return math.ceil(elements / shard)


def post_step_gather(elements: tuple[int, ...], ranks: int, axis: str, bytes_per_param: int,
                     host_us_per_slice: float) -> CommOp | None:
    """The all-gather of the persistent parameters after the optimizer step, with the
    copies and host time around it (None without persistent parameters or with one rank).

    Its message is every parameter's padded shard times ``ranks``; its copies are PyTorch's
    ``ranks`` slice copies out of its flat buffer plus :func:`slice_copies` for each
    parameter, one launch each (:meth:`llmsim.costs.HardwareCosts.comm_s`); its host time
    is ``host_us_per_slice`` for each rank of the list loop and for each copy of the
    parameters' loop, whose bodies (a ``narrow`` per rank; two ``narrow`` and a ``view``
    per copy) are priced at the measured time of the per-parameter gathers' own list loop
    (``parallelism.tensor_list_host_us_per_rank``).
    """
    if not elements or ranks == 1:
        return None
    shards = sum(math.ceil(e / ranks) for e in elements)
    copies = sum(slice_copies(e, ranks) for e in elements)
    return CommOp("z3_post_step_ag", "all_gather", axis, "O",
                  float(shards * ranks * bytes_per_param), copies=ranks + copies,
                  host_s=(ranks + copies) * host_us_per_slice * 1e-6)
