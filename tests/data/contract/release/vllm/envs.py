try:
    VLLM_USE_DEEP_GEMM: bool = True
except ImportError:
    VLLM_USE_DEEP_GEMM = False
