from .parallel_state import *  # noqa: F403
