"""Stand-ins for what TensorRT-LLM's module runners (backends/trtllm/dsa.py and msa.py through mla_module.py and
context.py) import besides the model's own classes: the quant config, mapping, aux streams, model_extra_attrs, the
cache manager's class lookup and records, the attention metadata's records, and the device calls torch makes. Each
test's fake subclasses TrtllmWorld and adds its model's config, layer, attention and metadata classes."""

from __future__ import annotations

import contextlib
import fnmatch
import gc
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import install_fakes

from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import release_pending

torch = pytest.importorskip("torch")


# imports of msa.py, dsa.py and mla_module.py that TrtllmWorld stands in for: each runner's contract test requires
# the check (backends/symbols.py) to cover them
WORLD_SYMBOLS = {
    "tensorrt_llm._torch.pyexecutor._util.get_kv_cache_manager_cls",
    "tensorrt_llm._torch.pyexecutor.resource_manager.KvCacheConfig",
    "tensorrt_llm._torch.attention_backend.interface.AttentionRuntimeFeatures",
    "tensorrt_llm._torch.metadata.KVCacheParams",
    "tensorrt_llm._torch.utils.model_extra_attrs",
    "tensorrt_llm._torch.utils.AuxStreamType",
}


def record(**kw):  # Mapping, KvCacheConfig, AttentionRuntimeFeatures, KVCacheParams: the fields as given
    return SimpleNamespace(**kw)


class QuantConfig:  # models/modeling_utils.py: the algorithms, and the modules an fp8 block checkpoint excludes
    def __init__(self, **kw):
        self.quant_algo, self.exclude_modules = kw.get("quant_algo"), kw.get("exclude_modules")
        self.kv_cache_quant_algo = kw.get("kv_cache_quant_algo")

    def is_module_excluded_from_quantization(self, name):
        return any(fnmatch.fnmatch(name, p) for p in self.exclude_modules or ())


class Linear(torch.nn.Module):  # modules/linear.py: weights created later, fp8 for FP8_BLOCK_SCALES
    def __init__(self, n, k, quant):
        super().__init__()
        self.shape, self.quant_config = (n, k), quant

    def create_weights(self):
        fp8 = getattr(self.quant_config, "quant_algo", None) == "FP8_BLOCK_SCALES"
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        self.weight = torch.nn.Parameter(torch.zeros(self.shape, dtype=dtype), requires_grad=False)


class TrtllmWorld:
    """Records what the runner hands the stand-ins: ``events`` (in order), the ModelConfigs, built layers, cache
    managers, attention metadata and forwards; ``current`` is the dict model_extra_attrs holds now."""

    def __init__(self, capability=(9, 0)):
        self.capability = capability
        self.events: list = []
        self.model_configs: list = []
        self.layers: list = []
        self.managers: list = []
        self.metadata: list = []
        self.forwards: list = []
        self.current: dict | None = None

    def model_config_class(self):
        fake = self

        class ModelConfig:
            def __init__(self, **kw):
                self.__dict__.update(kw)
                self.kw, self.extra_attrs = kw, {}
                fake.model_configs.append(self)

        return ModelConfig

    def manager_class(self):
        """A cache manager recording its arguments; a subclass's add_dummy_requests hands its requests to ``added``,
        which takes them unless a test put "full" in ``events`` (then None, as a pool without room answers)."""
        fake = self

        class Manager:
            def __init__(self, cache_config, cache_type, **kw):
                self.cache_config, self.cache_type, self.kw = cache_config, cache_type, kw
                fake.managers.append(self)

            def added(self, *requests):
                self.requests = requests
                return None if "full" in fake.events else []

            def shutdown(self):
                fake.events.append("shutdown")

        return Manager

    def manager_cls_of(self, manager):
        """get_kv_cache_manager_cls with its rc20/rc23 signature, answering ``manager``."""

        def get_kv_cache_manager_cls(model_config, kv_cache_config, is_disagg=False):
            self.events.append(("manager_cls", model_config, kv_cache_config))
            return manager

        return get_kv_cache_manager_cls

    @contextlib.contextmanager
    def model_extra_attrs(self, attrs):
        previous, self.current = self.current, attrs
        try:
            yield
        finally:
            self.current = previous

    def built(self, layer_idx, aux_stream_dict, module) -> None:
        """A decoder layer's construction: its index, the aux streams it was handed and its attention module."""
        self.layers.append(SimpleNamespace(layer_idx=layer_idx, streams=aux_stream_dict, module=module))

    def forward(self, position_ids, hidden_states, attn_metadata) -> None:
        """An attention forward: what it was handed and the metadata model_extra_attrs registered for it then."""
        registered = self.current["attention_metadata"]()
        self.forwards.append((position_ids, hidden_states, attn_metadata, registered))

    def install_world(self, monkeypatch, modules: dict, manager_cls, cache_type: str, data_types: tuple) -> None:
        """install_fakes with the shared modules and ``modules`` (the test's own), and torch's device calls: the
        capability, a stream and a sync (recorded), the source check recorded instead of reading the package."""
        install_fakes(monkeypatch, {
            "tensorrt_llm.models.modeling_utils": {"QuantConfig": QuantConfig, "QuantAlgo": {
                "FP8": "FP8", "FP8_BLOCK_SCALES": "FP8_BLOCK_SCALES", "NVFP4": "NVFP4"}},
            "tensorrt_llm.mapping": {"Mapping": record},
            "tensorrt_llm._torch.utils": {"AuxStreamType": SimpleNamespace(
                Attention="attention", MoeShared="moe_shared", MoeChunkingOverlap="moe_chunking"),
                "model_extra_attrs": self.model_extra_attrs},
            "tensorrt_llm._torch.pyexecutor._util": {"get_kv_cache_manager_cls": manager_cls},
            "tensorrt_llm._torch.pyexecutor.resource_manager": {
                "CacheTypeCpp": SimpleNamespace(**{cache_type: cache_type}),
                "DataType": SimpleNamespace(**{d: d for d in data_types}), "KvCacheConfig": record},
            "tensorrt_llm._torch.attention_backend.interface": {"AttentionRuntimeFeatures": record},
            "tensorrt_llm._torch.metadata": {"KVCacheParams": record},
            **modules,
        })  # fmt: skip
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: self.capability)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: ("stream", device))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.events.append("sync"))
        monkeypatch.setattr(torch_ops, "check_installed", lambda op, root=None: self.events.append(("checked", op)))

    def install(self, monkeypatch) -> None:
        raise NotImplementedError


def installed(cls, monkeypatch, **kw) -> TrtllmWorld:
    """A fresh ``cls(**kw)`` installed, after the pools an earlier case still holds are released."""
    release_pending()
    fake = cls(**kw)
    fake.install(monkeypatch)
    return fake


def fake_fixture(cls):
    """The ``fake`` fixture of a test module: ``cls`` installed, and the case's pools released after the test."""

    @pytest.fixture
    def fake(monkeypatch):
        yield installed(cls, monkeypatch)
        release_pending()
        gc.collect()

    return fake


def package_tree(root: Path, files: dict[str, str]) -> Path:
    """An installed tensorrt_llm under ``root`` holding ``files`` (path in the package: text), for torch_ops' checks."""
    for rel, text in files.items():
        path = root / "tensorrt_llm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "tensorrt_llm"
