from .vllm import *  # noqa: F403
