"""Run vLLM 0.24.0's own kernel-selection code on a CPU for each target SM and write what it chose.

    .venv/bin/python scripts/selection_tables.py [--wheel W] [-o cases/selection/vllm-0.24.0.yaml] [--check]

The planner's vLLM dispatch (plans/moe.py, attention.py, mla.py, mla_module.py) reads the YAML this writes; it never
imports a framework. Here the pinned wheel's Python files are imported with CPU torch and:

- the CUDA platform made to report the target SM: a CudaPlatformBase whose get_device_capability returns it, set as
  vllm.platforms' current platform before any selection module binds it (platforms/__init__.py:254-280). Every
  has/is_device_capability* call of the selection code goes through get_device_capability
  (platforms/interface.py:418-478).
- the image's packages reported as installed (IMAGE): flashinfer-python and flashinfer-cubin 0.6.12 (the wheel's
  Requires-Dist), the vendored DeepGEMM and triton_kernels (utils/import_utils.py:475-498), Triton
  (triton_utils/importing.py). These probes look for packages a CPU machine lacks; their answers are the image's.
- the wheel's compiled extensions (vllm/*.so: _C_stable_libtorch, _vllm_fa2_C, _vllm_fa3_C, _flashmla_C, ...)
  stubbed as present, as they are in the image, and the modules only serving needs (STUBS: tokenizers, zmq,
  transformers, ...): nothing the selection functions call reads them. Two compiled capability probes are
  answered as their C++ answers (Selector._image), and module-level CUDA buffers go to the meta device.

What it calls, per SM: the MoE oracles the quant methods call in their __init__ with the keys they pass
(fused_moe/oracle/*.py select_*_moe_backend), the attention selector (platforms/cuda.py:395-490 get_attn_backend_cls,
the same call v1/attention/selector.py:114-127 makes) and the FlashAttention version (v1/attention/backends/
fa_utils.py:57-160). Kernel names follow the vLLM runners' labels (backends/vllm/moe.py kernel_name,
backends/vllm/attention.py kernel_source, backends/vllm/mla.py). Choices made inside compiled code or per call
(FlashInfer's TRT-LLM-gen attention kernels, FallbackExperts by batch shape) stay with the plans' hand-written rules.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
import zipfile
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.24.0"
WHEELS = ROOT / ".cache" / "wheels"  # `nox -s contract-vllm` downloads the pinned wheel here
OUTPUT = ROOT / "cases" / "selection" / f"vllm-{VERSION}.yaml"
SMS = (90, 100, 103, 120)

# third-party modules on the import path of the selection code that only serving uses; stubbed
STUBS = (
    "regex",
    "psutil",
    "zmq",
    "cbor2",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "aiohttp",
    "openai_harmony",
    "openai",
    "compressed_tensors",
    "msgspec",
    "pybase64",
    "cachetools",
    "cloudpickle",
    "uvloop",
    "cpuinfo",
    "prometheus_client",
    "tqdm",
    "flashinfer",  # the image's flashinfer-python 0.6.12: the FlashInfer backends import it at module level
    "einops",
    "tokenspeed_mla",  # the image's tokenspeed-mla 0.1.2 (Requires-Dist): TOKENSPEED_MLA imports it
)

# the image's answers to vLLM's "is this package installed" probes
IMAGE = {
    "vllm.utils.flashinfer": (
        "has_flashinfer",
        "has_flashinfer_cubin",
        "has_flashinfer_moe",
        "has_flashinfer_trtllm_fused_moe",
        "has_flashinfer_cutlass_fused_moe",
        "has_flashinfer_cutedsl",
        "has_flashinfer_cutedsl_grouped_gemm_nt_masked",
        "has_flashinfer_cutedsl_moe_nvfp4",
        "has_flashinfer_fp8_blockscale_gemm",
    ),
    "vllm.utils.import_utils": ("has_deep_gemm", "has_triton_kernels"),
}


class _StubBase:
    """What a class deriving from a stubbed base (msgspec.Struct, ...) derives from instead."""

    def __init_subclass__(cls, **kwargs):
        pass

    def __class_getitem__(cls, item):
        return cls


class _Stub(types.ModuleType):
    """A module whose every attribute is another stub: enough for import-time annotations and decorators."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Stub(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return _Stub(self.__name__ + "()")

    def __iter__(self):
        return iter(())

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __getitem__(self, key):
        return self

    def __mro_entries__(self, bases):
        return (_StubBase,)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, compiled: frozenset[str]):
        self.compiled = compiled  # the wheel's compiled extensions: present in the image, stubbed here

    def find_spec(self, name, path, target=None):
        if name in self.compiled or name in STUBS or name.split(".")[0] in STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def find_wheel() -> Path | None:
    wheels = sorted(WHEELS.glob(f"vllm-{VERSION}-*.whl"))
    return wheels[-1] if wheels else None


def unpack(wheel: Path) -> tuple[Path, frozenset[str]]:
    """The wheel's Python files under .cache (once), and the module names of its compiled extensions."""
    target = ROOT / ".cache" / f"vllm-{VERSION}-py"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        if not (target / "vllm" / "__init__.py").exists():
            zf.extractall(target, members=[n for n in names if n.startswith("vllm/") and n.endswith(".py")])
    compiled = {n.split(".")[0].replace("/", ".") for n in names if n.startswith("vllm/") and n.endswith(".so")}
    return target, frozenset(compiled)


class Selector:
    """vLLM imported from ``source`` with a platform whose SM the caller sets."""

    def __init__(self, source: Path, compiled: frozenset[str]):
        import torch  # noqa: F401  (CPU torch, imported before the stubs go in)

        sys.path.insert(0, str(source))
        sys.meta_path.append(_StubFinder(compiled))
        version = importlib.metadata.version
        # transformers_utils/config.py:55 refuses Transformers v4; the stub stands for the v5 the wheel requires
        importlib.metadata.version = lambda name: "5.5.3" if name == "transformers" else version(name)
        import vllm.platforms as platforms
        from vllm.platforms.cuda import CudaPlatformBase
        from vllm.platforms.interface import DeviceCapability

        class TargetPlatform(CudaPlatformBase):
            capability: DeviceCapability | None = None  # none while importing: see _import

            @classmethod
            def get_device_capability(cls, device_id: int = 0):
                return cls.capability

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                return f"sm{cls.capability.to_int()}" if cls.capability else "cpu"

            @classmethod
            def num_compute_units(cls, device_id: int = 0) -> int:
                # a module-level workspace sizes itself by it (mla/cutlass_mla.py:87,107); no selection reads it
                return 132

        self.platform_cls = TargetPlatform
        platforms._current_platform = TargetPlatform()
        self._image()
        self._import()

    def _import(self) -> None:
        """Import the selection modules with no SM reported: a few modules ask compiled ops at import time
        (quantization/utils/w8a8_utils.py:41 CUTLASS_FP8_SUPPORTED), which the stubbed extensions cannot answer;
        those constants are the GEMM path's, not read by the MoE oracles or the attention selector."""
        from torch.overrides import TorchFunctionMode

        class CudaToMeta(TorchFunctionMode):
            """Module-level CUDA buffers (mla/flashinfer_mla.py:108 g_fi_workspace) land on the meta device."""

            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                if str(kwargs.get("device", "")).startswith("cuda"):
                    kwargs["device"] = "meta"
                return func(*args, **kwargs)

        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        with CudaToMeta(), self.served():
            for name in SELECTION_MODULES:
                importlib.import_module(name)
            for backend in ATTENTION_BACKENDS:  # the selector imports them lazily (platforms/cuda.py:157-158)
                getattr(AttentionBackendEnum, backend).get_class()

    def _image(self) -> None:
        def yes(*args, **kwargs) -> bool:
            return True

        originals = {}
        for module_name, names in IMAGE.items():
            module = importlib.import_module(module_name)
            for name in names:
                originals[id(getattr(module, name))] = name
                setattr(module, name, yes)
        import vllm._custom_ops as ops
        import vllm.triton_utils.importing as triton_importing

        triton_importing.HAS_TRITON = True
        # compiled: csrc/quantization/w8a8/cutlass/scaled_mm_entry.cpp cutlass_scaled_mm_supports_fp8, true from
        # SM89 with the image's CUDA >= 12.4
        ops.cutlass_scaled_mm_supports_fp8 = lambda capability: capability >= 89
        # and cutlass_scaled_mm_supports_block_fp8: the SM90 and SM100 block kernels (capability 90 to 10x)
        ops.cutlass_scaled_mm_supports_block_fp8 = lambda capability: 90 <= capability < 110
        # modules imported before the patch bound the probes by name: rebind them
        for module in list(sys.modules.values()):
            if module is None or not getattr(module, "__name__", "").startswith("vllm"):
                continue
            for attr, value in list(vars(module).items()):
                if id(value) in originals and callable(value):
                    setattr(module, attr, yes)

    def set_sm(self, sm: int) -> None:
        from vllm.platforms.interface import DeviceCapability

        self.platform_cls.capability = DeviceCapability(sm // 10, sm % 10)

    # --- MoE ---------------------------------------------------------------------------------------------------

    def moe_config(self, *, ep: int, activation: str = "silu", has_bias: bool = False, hidden: int = 4096):
        """The FusedMoEConfig FusedMoE builds for one rank of the runner's layer (fused_moe/layer.py:309-330):
        bf16 activations, top-k softmax routing with renormalize (router/fused_topk_router.py:136-143), EP by
        enable_expert_parallel at world size 1 (config.py:1180-1238)."""
        import torch
        from vllm.config import ParallelConfig
        from vllm.model_executor.layers.fused_moe import config as moe_config_module
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.config import (
            FusedMoEConfig,
            FusedMoEParallelConfig,
            get_routing_method_type,
        )

        # ParallelConfig's defaults (config/parallel.py:171,185); building one validates an executor, not needed here
        fields = ParallelConfig.__dataclass_fields__
        served = SimpleNamespace(
            enable_expert_parallel=ep > 1,
            enable_eplb=fields["enable_eplb"].default,
            all2all_backend=fields["all2all_backend"].default,
        )
        # rank 0 of the split, as the runner times it: no process group needed (config.py:1096-1104)
        moe_config_module.get_tensor_model_parallel_rank = lambda: 0
        parallel = FusedMoEParallelConfig.make(ep, 1, 1, 1, served)
        experts = 128
        return FusedMoEConfig(
            num_experts=experts,
            experts_per_token=8,
            hidden_dim=hidden,
            intermediate_size=2048,
            num_local_experts=experts // ep,
            num_logical_experts=experts,
            activation=MoEActivation(activation),
            device="cuda",
            routing_method=get_routing_method_type("softmax", 8, True, None, False),
            moe_parallel_config=parallel,
            in_dtype=torch.bfloat16,
            has_bias=has_bias,
        )

    @contextmanager
    def served(self, **text_config):
        """The current VllmConfig as the runners set it (backends/vllm/context.py vllm_context): defaults, and a
        model stand-in of bf16 activations without a quantization_config."""
        import torch
        from vllm.config import VllmConfig, set_current_vllm_config

        config = VllmConfig()
        config.model_config = SimpleNamespace(
            dtype=torch.bfloat16,
            hf_text_config=SimpleNamespace(model_type="", **text_config),
            quantization_config=None,
            is_diffusion=False,
        )
        with set_current_vllm_config(config, check_compile=False):
            yield config

    def moe(self, dtype: str, ep: int) -> str:
        """What the quant method's __init__ gets from its oracle, as the vLLM runner labels it."""
        with self.served():
            return self._moe(dtype, ep)

    def _moe(self, dtype: str, ep: int) -> str:
        from vllm.model_executor.layers.fused_moe.oracle import fp8, int_wna16, mxfp4, nvfp4, unquantized
        from vllm.model_executor.layers.quantization.utils import quant_utils as q

        if dtype == "bfloat16":  # unquantized_fused_moe_method.py:51-55
            method, (backend, cls) = (
                "UnquantizedFusedMoE",
                unquantized.select_unquantized_moe_backend(self.moe_config(ep=ep)),
            )
        elif dtype == "fp8":  # ModelOptFp8MoEMethod: modelopt.py:766-771
            method, (backend, cls) = (
                "ModelOptFp8MoE",
                fp8.select_fp8_moe_backend(self.moe_config(ep=ep), q.kFp8StaticTensorSym, q.kFp8StaticTensorSym),
            )
        elif dtype == "fp8_block":  # Fp8MoEMethod, block: fp8.py:514-532
            method, (backend, cls) = (
                "Fp8MoE",
                fp8.select_fp8_moe_backend(
                    self.moe_config(ep=ep), q.kFp8Static128BlockSym, q.kFp8Dynamic128Sym, allow_vllm_cutlass=False
                ),
            )
        elif dtype == "int4_wo":  # compressed-tensors int4 group 128: compressed_tensors_moe_wna16_marlin.py:70-96
            from vllm.scalar_type import scalar_types

            key = q.QuantKey(scalar_types.uint4b8, q.kInt4StaticGroupScale, symmetric=True)
            method, (backend, cls) = (
                "CompressedTensorsWNA16MarlinMoE",
                int_wna16.select_wna16_moe_backend(self.moe_config(ep=ep), key),
            )
        elif dtype == "w4a16_mxfp4":  # gpt-oss: GptOssMxfp4MoEMethod (mxfp4.py:135-141), swigluoai with bias
            config = self.moe_config(ep=ep, activation="swigluoai", has_bias=True, hidden=2880)
            method, (backend, cls) = "GptOssMxfp4MoE", mxfp4.select_mxfp4_moe_backend(config)
        elif dtype == "nvfp4":  # ModelOptNvFp4FusedMoEMethod: modelopt.py:1400-1414
            method, (backend, cls) = (
                "ModelOptNvFp4FusedMoE",
                nvfp4.select_nvfp4_moe_backend(self.moe_config(ep=ep), q.kNvfp4Static, q.kNvfp4Dynamic),
            )
        else:
            raise ValueError(dtype)
        name = cls.__name__ if cls is not None else "direct"
        return f"vllm_{method}_{backend.value}_{name}".lower().replace(" ", "_").replace("-", "_")

    # --- attention ---------------------------------------------------------------------------------------------

    def attention_backend(self, head_size: int, kv_cache_dtype: str, use_mla: bool = False, num_heads=None) -> str:
        """The backend name the selector picks with no --attention-backend (platforms/cuda.py:395-490)."""
        import torch
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.v1.attention.selector import AttentionSelectorConfig

        config = AttentionSelectorConfig(
            head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype, block_size=None, use_mla=use_mla
        )
        with self.served(**(DEEPSEEK_MLA if use_mla else {})):
            path = self.platform_cls.get_attn_backend_cls(None, attn_selector_config=config, num_heads=num_heads)
        return resolve_obj_by_qualname(path).get_name()

    def attention_label(self, head_size: int, kv_cache_dtype: str) -> str:
        """The backend as the vLLM runner labels it (backends/vllm/attention.py kernel_source): FLASH_ATTN with its
        version (flash_attn.py:666-669 reads get_flash_attn_version), FLASHINFER whole (its prefill/decode kernels
        are picked per batch: the plan's case rule), any other vllm_<name>."""
        name = self.attention_backend(head_size, kv_cache_dtype)
        if name == "FLASH_ATTN":
            return f"vllm_flash_attn_fa{self.flash_attn_version(head_size)}"
        return name if name == "FLASHINFER" else f"vllm_{name.lower()}"

    def flash_attn_version(self, head_size: int) -> int | None:
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        with self.served():
            return get_flash_attn_version(head_size=head_size)


SELECTION_MODULES = (
    "vllm.model_executor.layers.fused_moe.oracle.fp8",
    "vllm.model_executor.layers.fused_moe.oracle.int_wna16",
    "vllm.model_executor.layers.fused_moe.oracle.mxfp4",
    "vllm.model_executor.layers.fused_moe.oracle.nvfp4",
    "vllm.model_executor.layers.fused_moe.oracle.unquantized",
    "vllm.model_executor.layers.quantization.utils.quant_utils",
    "vllm.v1.attention.selector",
    "vllm.v1.attention.backends.fa_utils",
)
# the CUDA platform's priority lists (platforms/cuda.py:84-154), SM120's sparse one aside
ATTENTION_BACKENDS = (
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "FLASH_ATTN_MLA",
    "FLASHMLA",
    "FLASHINFER_MLA",
    "TRITON_MLA",
    "CUTLASS_MLA",
    "TOKENSPEED_MLA",
)
# DeepSeek-V3's MLA dims (its config.json), which the MLA backends check (mla/flashinfer_mla.py:89-100,
# mla/tokenspeed_mla.py:113-125); the MLA module tables are DeepSeek's
DEEPSEEK_MLA = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512}
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4", "nvfp4")
HEAD_DIMS = (64, 80, 96, 128, 192, 256, 512)
# opcollect's KV dtype -> vLLM's cache_dtype (backends/vllm/attention.py CACHE_DTYPE)
KV_DTYPES = {"bfloat16": "auto", "fp8": "fp8"}


def _attempt(fn, *args) -> str:
    try:
        return str(fn(*args))
    except (ValueError, NotImplementedError) as err:  # the selector refuses: no backend serves the case
        return f"unsupported: {str(err).splitlines()[0][:120]}"


def tables(selector: Selector, sms=SMS) -> dict:
    out: dict = {"framework": "vllm", "version": VERSION, "sm": {}}
    for sm in sms:
        selector.set_sm(sm)
        moe = {
            dtype: {"tp": _attempt(selector.moe, dtype, 1), "ep": _attempt(selector.moe, dtype, 2)}
            for dtype in MOE_DTYPES
        }
        attention = {
            kv: {head: _attempt(selector.attention_label, head, cache) for head in HEAD_DIMS}
            for kv, cache in KV_DTYPES.items()
        }
        mla = {kv: _attempt(selector.attention_backend, 576, cache, True, 128) for kv, cache in KV_DTYPES.items()}
        out["sm"][sm] = {"moe": moe, "attention": attention, "mla": mla}
    return out


def generate(wheel: Path | None = None) -> dict:
    wheel = wheel or find_wheel()
    if wheel is None:
        raise FileNotFoundError(f"no vllm-{VERSION} wheel in {WHEELS}; `nox -s contract-vllm` downloads it")
    return tables(Selector(*unpack(wheel)))


def dump(data: dict) -> str:
    import yaml

    header = (
        f"# vLLM {VERSION}'s own kernel selection per SM, written by scripts/selection_tables.py from the\n"
        "# pinned wheel (do not edit: regenerate; tests/test_vllm_selection.py compares). The planner's vLLM\n"
        "# dispatch reads it.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, width=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args(argv)
    text = dump(generate(args.wheel))
    if args.check:
        same = args.output.exists() and args.output.read_text() == text
        print(f"{args.output}: {'up to date' if same else 'differs from the wheel selection'}")
        return 0 if same else 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
