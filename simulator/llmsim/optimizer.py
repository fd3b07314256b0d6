"""Bytes per parameter of the gradient buffer and the optimizer step, by framework.

What each data-parallel gradient element weighs in the reduction, what adding one
micro-batch's gradients to the buffer costs with a kernel of its own
(``training.grad_accumulation``), and the optimizer step's passes over the local shard
(``training.optimizer_kernels``), each as the framework's code of the time runs it.
"""

from __future__ import annotations

from llmsim.ops import ComputeOp
from llmsim.specs import Parallelism, Training

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
"""Bytes per element of a weight, gradient or activation in each training precision. FP8
training keeps activations and weights in 16 bits and casts to FP8 only at the GEMM
inputs (Transformer Engine)."""

FP32 = DTYPE_BYTES["fp32"]
"""Bytes of an FP32 value (master weights, optimizer state, FP32 gradients)."""

ADAM_STATE_BYTES = 3 * FP32
"""FP32 weight and Adam's two moments, per parameter, read and written by each step."""

def grad_bytes_per_param(precision: str, reduce_dtype: str | None = None) -> int:
    """Bytes per gradient element in the data-parallel reduction.

    ``reduce_dtype`` (``parallelism.grad_reduce_dtype``) when the scenario names one;
    otherwise Megatron-LM's default: FP32 when training in BF16 or FP8 (``--bf16`` forces
    ``accumulate_allreduce_grads_in_fp32``), FP16 when training in FP16.
    """
    if reduce_dtype is not None:
        return DTYPE_BYTES[reduce_dtype]
    return DTYPE_BYTES["fp16"] if precision == "fp16" else FP32


def grad_accumulation_bytes_per_param(mode: str, param_bytes: int, grad_bytes: int) -> int:
    """HBM bytes per parameter to add one micro-batch's gradient to the gradient buffer
    with a kernel of its own (``training.grad_accumulation``).

    ``fused``: Megatron-LM's data-parallel hook, for the parameters no GEMM accumulates
    (``param.main_grad.add_(param.grad.data)``): read the gradient, read and write the
    ``grad_bytes`` buffer. ``autograd``: PyTorch's AccumulateGrad, ``param.grad += new``,
    all in the parameters' dtype. ``fp32_cast_add``: DeepSpeed's BF16_Optimizer,
    ``hp_grad.add_(lp.grad.to(float32))``: the cast reads the gradient and writes an FP32
    copy, the add reads the copy and reads and writes the FP32 gradient.
    """
    if mode == "autograd":
        return 3 * param_bytes
    if mode == "fp32_cast_add":
        return param_bytes + FP32 + 3 * FP32
    return param_bytes + 2 * grad_bytes


def optimizer_step(par: Parallelism, training: Training, params: int, tensors: int,
                   dp: int) -> ComputeOp:
    """The optimizer step of one device holding ``params`` parameters in ``tensors``
    tensors, and the reset of its gradient buffer for the next step.

    Adam reads the FP32 weight, gradient and two moments and writes the weight and the
    moments: 28 bytes per parameter of the local shard (1/dp of them with ZeRO). Around it,
    by ``training.optimizer_kernels``:

    - ``multi_tensor``: 16-bit gradients cast to FP32 copies (read 2, write 4), with fp16
      the unscale and inf/NaN check (read and write 4; ``_amp_foreach_non_finite_check_
      and_unscale_``), the norm for clipping (read 4), the 16-bit weights written from the
      FP32 ones (read 4, write 2; Megatron-LM's ``_copy_main_params_to_model_params``).
    - ``fused``: the norm reads the gradient, and the Adam kernel reads the gradient in its
      own dtype and writes the 16-bit weight too (apex ``DistributedFusedAdam``).
    - ``per_tensor``: ``multi_tensor``, plus the overflow check's ``x.float().sum()`` per
      gradient tensor (the cast's 2 + 4 for 16-bit ones, the sum's 4), and one launch per
      tensor for each of the check's cast, sum and copy to the host, the norm's kernel and
      copy to the host, and the weight copy: six per tensor, none of them hidden behind
      the previous one, since each check waits for its result (Megatron-LM 2020's
      ``DynamicLossScaler.has_overflow_serial``, ``mpu.clip_grad_norm``,
      ``master_params_to_model_params``).

    The clipping itself (a pass over the gradients when the norm exceeds the limit) depends
    on the data and is not priced. Gradients accumulated in a persistent buffer (every
    ``training.grad_accumulation`` but ``autograd``, whose gradients are freed after the
    step) have it zeroed once per step: one write of each local gradient.
    """
    shard = params / (dp if par.zero >= 1 else 1)
    g = grad_bytes_per_param(training.precision, par.grad_reduce_dtype)
    weight16 = 0 if training.precision == "fp32" else DTYPE_BYTES[training.precision]
    adam_state = 2 * ADAM_STATE_BYTES  # read and written
    if training.optimizer_kernels == "fused":
        per_param = g + (g + adam_state + weight16)  # norm; Adam on the reduced gradient
    else:
        cast = g + FP32 if g < FP32 else 0
        unscale = 2 * FP32 if training.precision == "fp16" else 0
        copy16 = FP32 + weight16 if weight16 else 0
        per_param = cast + unscale + FP32 + (FP32 + adam_state) + copy16
        if training.optimizer_kernels == "per_tensor":
            per_param += cast + FP32  # x.float() (a copy only of 16-bit x), then its sum
    held = params if par.zero < 2 else shard
    reset = g * held if training.grad_accumulation != "autograd" else 0.0
    launches = 6 * tensors if training.optimizer_kernels == "per_tensor" else 1
    return ComputeOp("optimizer", "memory", "O", 0.0, per_param * shard + reset,
                     splits=launches, memory_kind="optimizer")
