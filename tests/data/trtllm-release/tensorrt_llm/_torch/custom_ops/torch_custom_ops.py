# API skeleton of tensorrt_llm/_torch/custom_ops/torch_custom_ops.py at NVIDIA/TensorRT-LLM@index id 3493221792: names and parameters only.
import torch


class FinegrainedMixedDtypeGemm:
    _runner_dict = ...
    MAX_SUPPORTED_SM_VERSION = ...

    def __init__(self, activation_dtype, output_dtype, quant_mode):
        ...
