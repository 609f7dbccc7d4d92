def init_distributed_environment(world_size=-1, rank=-1, **kwargs):
    return None


def ensure_model_parallel_initialized(tensor_model_parallel_size, pipeline_model_parallel_size, backend=None):
    return None
