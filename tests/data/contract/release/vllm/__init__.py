from vllm.config import VllmConfig

__all__ = ["VllmConfig"]
