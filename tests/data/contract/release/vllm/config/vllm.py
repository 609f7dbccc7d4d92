__all__ = ["VllmConfig", "set_current_vllm_config"]


class VllmConfig:
    def __init__(self, model_config=None, quant_config=None):
        self.model_config = model_config


def set_current_vllm_config(vllm_config, check_compile=False, prefix=None):
    return vllm_config


def _private():
    return None
