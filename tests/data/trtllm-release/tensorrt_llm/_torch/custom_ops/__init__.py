# API skeleton of tensorrt_llm/_torch/custom_ops/__init__.py at NVIDIA/TensorRT-LLM@0231463f3dd7fff3f72f5c1d60b55f2a7e5da6f0: names and parameters only.
from ..cuda_tile_utils import IS_CUDA_TILE_AVAILABLE
from ..cute_dsl_utils import IS_CUTLASS_DSL_AVAILABLE
from ..flashinfer_utils import IS_FLASHINFER_AVAILABLE
from .cpp_custom_ops import _register_fake
from .torch_custom_ops import OutputBufferKind, bmm_out
from .trtllm_gen_custom_ops import fp8_block_scale_moe_runner
from .userbuffers_custom_ops import add_to_ub, copy_to_userbuffers, matmul_to_ub
__all__ = ['IS_FLASHINFER_AVAILABLE', '_register_fake', 'bmm_out', 'OutputBufferKind', 'fp8_block_scale_moe_runner', 'add_to_ub', 'copy_to_userbuffers', 'matmul_to_ub', 'IS_CUTLASS_DSL_AVAILABLE']
from .flashinfer_custom_ops import flashinfer_apply_rope_with_cos_sin_cache_inplace, flashinfer_fused_add_rmsnorm, flashinfer_gemma_fused_add_rmsnorm, flashinfer_gemma_rmsnorm, flashinfer_rmsnorm, flashinfer_silu_and_mul
from .cute_dsl_custom_ops import cute_dsl_nvfp4_gemm_blackwell
from .cuda_tile_custom_ops import cuda_tile_rms_norm, cuda_tile_rms_norm_fuse_residual_
