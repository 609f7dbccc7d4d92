"""A made-up runner: each framework use below is one the contract check must resolve."""


def prepare(case):
    from vllm import VllmConfig, envs
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized
    from vllm.model_executor.layers.linear import ReplicatedLinear, RowParallelLinear

    config = VllmConfig(model_config=None)
    with set_current_vllm_config(config, check_compile=False):
        ensure_model_parallel_initialized(1, 1)
        layer = RowParallelLinear(case.k, case.n, bias=False, disable_tp=True)
        other = ReplicatedLinear(case.k, case.n, quant_config=None)
    return layer, other, envs.VLLM_USE_DEEP_GEMM
