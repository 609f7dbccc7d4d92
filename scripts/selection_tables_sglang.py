"""Write SGLang's own kernel selection per model class and SM: cases/selection/sglang-<version>.yaml.

The planner (src/opcollect/plans/selection_sglang.py) predicts SGLang's attention and MLA backends, MoE runner
backend and fp8 linear kernel from this file instead of hand rules. The answers come from SGLang's ServerArgs
itself: its __post_init__ runs for each class below (an architecture with its checkpoint's quantization_config, EP
size and KV-cache dtype) with the device made to report the target SM (torch.cuda reports the capability; SGLang's
cached is_sm*_supported probes are cleared and re-run against it), and the fields it leaves (attention backends,
moe_runner_backend, quantization, page size) are recorded. For the "gemm/" classes the fp8 linear selection
Fp8LinearMethod runs with those server args is recorded instead (selection_sglang_fp8.py). Planning never imports
SGLang: it reads the YAML.

    python scripts/selection_tables_sglang.py [--source WHEEL_OR_DIR] [--out FILE] [--check]

The source is the pinned wheel (.cache/wheels/sglang-<version>-*.whl, downloaded by `nox -s contract-sglang`)
or an unpacked one. It imports with the project's venv (CPU torch): the serving-only packages SGLang's import
chain names (tokenizers, servers, kernels) are stubbed, as are three sglang modules server_args imports for
parsers it never calls here (see STUB_SGLANG). --check compares with the committed file and exits 1 on a
difference (tests/test_sglang_selection.py runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import yaml
from selection_sglang_fp8 import fp8_choices

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.5.14"
OUT = ROOT / "cases" / "selection" / f"sglang-{VERSION}.yaml"

# Top-level packages SGLang's import of server_args needs that the project's venv lacks; none decides a kernel.
STUB_PACKAGES = (
    "orjson", "psutil", "pybase64", "triton", "starlette", "torchvision", "tqdm", "IPython", "aiohttp",
    "einops", "transformers", "zmq", "safetensors", "openai", "huggingface_hub", "dill", "partial_json_parser",
)  # fmt: skip
# sglang modules server_args imports for tool-call / reasoning parsers, the GDN chunk size and GGUF detection
STUB_SGLANG = (
    "sglang.srt.function_call.function_call_parser",
    "sglang.srt.entrypoints.openai.protocol",
    "sglang.srt.layers.attention.fla.chunk_delta_h",
    "sglang.srt.utils.hf_transformers_utils",
    "sglang.srt.layers.quantization",
)
# packages whose __init__ imports every model config: their submodules load, the __init__ does not run
HOLLOW = ("sglang.srt.configs", "sglang.srt.layers.cp")

# What the pinned image has (the wheel's Requires-Dist: flashinfer_python[cu13]==0.6.12, cuda-python>=13.0;
# triton_kernels is no dependency of sglang 0.5.14; sgl-deep-gemm==0.1.3 is, and installs deep_gemm)
ENVIRONMENT = {"cuda": "13.0", "flashinfer": True, "triton_kernels": False, "deep_gemm": True}
FLA_CHUNK_SIZE = 64  # layers/attention/fla/chunk_delta_h.py CHUNK_SIZE, whose module needs triton
SMS = {"90": (9, 0), "100": (10, 0)}
DEVICE_MIB = {"90": 143771, "100": 183359}  # H200, B200


@dataclasses.dataclass(frozen=True)
class ModelClass:
    """One serving configuration whose choices the plans need: an architecture, its checkpoint's
    quantization_config (None: bf16), and the server flags that change the choice."""

    name: str
    architecture: str
    quantization_config: dict | None = None
    ep_size: int = 1
    tp_size: int = 8
    kv_cache_dtype: str = "auto"
    mla: bool = False
    attention_sinks: bool = False
    mlp_hidden_act: str = "silu"
    quantization: str | None = None  # --quantization as the user passes it (serving's default: unset)


FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}  # per-tensor fp8
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
MXFP4 = {"quant_method": "mxfp4"}
# nvidia/DeepSeek-V4-Pro-NVFP4: FP8 attention with NVFP4 experts
NVFP4_HYBRID = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "moe_quant_algo": "NVFP4",
                "group_size": 16}  # fmt: skip
INT4_CT = {  # Kimi-K2.5's compressed-tensors int4 group-32 experts
    "quant_method": "compressed-tensors",
    "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32, "strategy": "group", "type": "int"}}},
}
QUANT = {"bfloat16": None, "fp8": FP8, "fp8_block": FP8_BLOCK, "nvfp4": NVFP4, "w4a16_mxfp4": MXFP4,
         "int4_wo": INT4_CT}  # fmt: skip

# The architectures the plans' MoE shapes, attention heads and MLA come from (cases/base_ops/*.yaml comments
# name the models): plans/selection.py maps each shape to one of these.
MOE_ARCHITECTURES = (
    "Qwen3MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "MiMoV2FlashForCausalLM", "GlmMoeDsaForCausalLM",
    "Llama4ForConditionalGeneration", "Gemma4ForConditionalGeneration", "NemotronHForCausalLM",
    "MiniMaxM2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "DeepseekV4ForCausalLM",
    "GptOssForCausalLM", "MixtralForCausalLM",
)  # fmt: skip
ATTENTION_ARCHITECTURES = (
    "LlamaForCausalLM", "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM", "Gemma4ForConditionalGeneration",
    "GptOssForCausalLM", "Llama4ForConditionalGeneration", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM",
)  # fmt: skip
# The MLA kernel tables' heads (cases/base_ops/mla_*.yaml): DeepSeek-V3's block-fp8 checkpoint and Kimi-K2.5's
# compressed-tensors int4 one; both take ServerArgs' DeepSeek branch (server_args.py:3519-3527, 3636-3650)
MLA_ARCHITECTURES = {"DeepseekV3ForCausalLM": FP8_BLOCK, "KimiK25ForConditionalGeneration": INT4_CT}
KV_DTYPES = {"bfloat16": "auto", "fp8": "fp8_e4m3"}
# fp8 linears: ServerArgs' --fp8-gemm-backend and what Fp8LinearMethod makes of it (selection_sglang_fp8.py); no
# architecture sets the flag in 0.5.14, so one plain model per checkpoint format
GEMM_ARCHITECTURE = "LlamaForCausalLM"
GEMM_DTYPES = ("fp8", "fp8_block")


def model_classes() -> list[ModelClass]:
    classes = []
    for arch in MOE_ARCHITECTURES:
        for dtype, quant in QUANT.items():
            for ep in (1, 8):
                act = "relu2" if arch == "NemotronHForCausalLM" else "silu"
                name = f"moe/{arch}/{dtype}/ep{ep}"
                quant = NVFP4_HYBRID if (arch, dtype) == ("DeepseekV4ForCausalLM", "nvfp4") else quant
                classes.append(ModelClass(name, arch, quant, ep_size=ep, mlp_hidden_act=act))
    for arch in ATTENTION_ARCHITECTURES:
        for kv, kv_flag in KV_DTYPES.items():
            sinks = arch == "GptOssForCausalLM"
            classes.append(ModelClass(f"attention/{arch}/{kv}", arch, kv_cache_dtype=kv_flag, attention_sinks=sinks))
    for arch, quant in MLA_ARCHITECTURES.items():
        for kv, kv_flag in KV_DTYPES.items():
            classes.append(ModelClass(f"mla/{arch}/{kv}", arch, quant, kv_cache_dtype=kv_flag, mla=True))
    for dtype in GEMM_DTYPES:
        classes.append(ModelClass(f"gemm/{GEMM_ARCHITECTURE}/{dtype}", GEMM_ARCHITECTURE, QUANT[dtype]))
    return classes


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock(name=f"{cls.__name__}.{name}")

    def __getitem__(cls, item):
        return cls


class _StubClass(metaclass=_StubMeta):
    def __init_subclass__(cls, **kwargs):
        pass

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return mock.MagicMock()


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_StubClass,), {"__module__": self.__name__}) if name[:1].isupper() else mock.MagicMock()
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs STUB_PACKAGES and STUB_SGLANG, and loads HOLLOW packages without their __init__."""

    def __init__(self, source: Path):
        self.source = source

    def find_spec(self, name, path, target=None):
        if name in HOLLOW:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if name.split(".")[0] in STUB_PACKAGES or any(name == m or name.startswith(m + ".") for m in STUB_SGLANG):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name in HOLLOW:
            module = types.ModuleType(spec.name)
            module.__path__ = [str(self.source.joinpath(*spec.name.split(".")))]
            return module
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _unpacked(source: Path) -> Path:
    """A directory holding the sglang package: the source itself, or the wheel extracted next to it."""
    if source.is_dir():
        return source
    target = source.with_suffix(".unpacked")
    if not (target / "sglang" / "srt" / "server_args.py").exists():
        with zipfile.ZipFile(source) as wheel:
            wheel.extractall(target, [n for n in wheel.namelist() if n.startswith(("sglang/", "sglang-"))])
    return target


def default_source() -> Path | None:
    wheels = sorted((ROOT / ".cache" / "wheels").glob(f"sglang-{VERSION}-*.whl"))
    return wheels[0] if wheels else None


def load_server_args(source: Path):
    """Import sglang.srt.server_args from the wheel with the stubs in place; the module."""
    path = _unpacked(source)
    if "sglang" in sys.modules:
        raise RuntimeError("another sglang is already imported in this process")
    sys.path.insert(0, str(path))
    sys.meta_path.insert(0, _Finder(path))
    logging.getLogger("sglang").setLevel(logging.ERROR)
    import sglang.srt.server_args as server_args

    version = importlib.import_module("sglang.version").__version__
    if version != VERSION:
        raise RuntimeError(f"{source}: sglang {version}, not the pinned {VERSION}")
    return server_args


def _clear_caches(module) -> None:
    for value in vars(module).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


def env(environment: dict | None) -> dict:
    return {**ENVIRONMENT, **(environment or {})}


@contextlib.contextmanager
def device(server_args, sm: str, environment: dict | None = None):
    """The process sees one CUDA device of this SM (torch.cuda and SGLang's cached probes on it) and the
    image's packages (flashinfer, triton_kernels per ENVIRONMENT)."""
    import torch

    common = sys.modules["sglang.srt.utils.common"]
    real_find_spec = importlib.util.find_spec
    present = {name: env(environment)[name] for name in ("flashinfer", "triton_kernels")}

    def find_spec(name, *args, **kwargs):
        top = name.split(".")[0]
        if top in present:
            return importlib.machinery.ModuleSpec(name, None) if present[top] else None
        return real_find_spec(name, *args, **kwargs)

    patches = [
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: SMS[sm]),
        mock.patch.object(torch.cuda, "device_count", lambda: 8),
        mock.patch.object(torch.version, "cuda", env(environment)["cuda"]),
        mock.patch.object(importlib.util, "find_spec", find_spec),
        mock.patch.object(server_args, "get_device_memory_capacity", lambda *a, **k: DEVICE_MIB[sm]),
        mock.patch.object(server_args, "get_nvidia_driver_version", lambda: (580,)),
        mock.patch.object(server_args, "check_gguf_file", lambda path: False),  # a stub: the checkpoint is no GGUF
        mock.patch.object(server_args, "FLA_CHUNK_SIZE", FLA_CHUNK_SIZE),  # a stub module's
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        _clear_caches(common)
        _clear_caches(server_args)
        try:
            yield
        finally:
            _clear_caches(common)
            _clear_caches(server_args)


class _Config(SimpleNamespace):
    """A ModelConfig / hf_config with the fields the selection code reads; any other field is absent (the
    code's getattr defaults apply) and is listed in ``absent`` for the generated file."""

    absent: set[str] = set()

    def __getattr__(self, name):
        if not name.startswith("__"):
            _Config.absent.add(name)
        raise AttributeError(name)


def _model_config(server_args, model: ModelClass):
    from sglang.srt.configs.model_config import AttentionArch

    quant = model.quantization_config
    hf = _Config(
        architectures=[model.architecture],
        mlp_hidden_act=model.mlp_hidden_act,
        sliding_window_pattern=None,
        index_topk_freq=1,
        index_topk_pattern=None,
    )
    if quant is not None:
        hf.quantization_config = dict(quant)
    quantization = None if quant is None else quant["quant_method"]
    return _Config(
        hf_config=hf,
        hf_text_config=hf,
        quantization=quantization,
        attention_arch=AttentionArch.MLA if model.mla else AttentionArch.MHA,
        has_attention_sinks=model.attention_sinks,
        is_encoder_decoder=False,
        context_len=8192,
        is_multimodal=False,
        get_num_kv_heads=lambda tp: 8,
        is_piecewise_cuda_graph_disabled_model=False,
        nvfp4_moe_meta=_nvfp4_moe_meta(quant),
    )


def _nvfp4_moe_meta(quant: dict | None) -> dict | None:
    """ModelConfig's hybrid FP8+NVFP4 detection (configs/model_config.py:350-364)."""
    if quant and str(quant.get("quant_algo", "")).upper() == "MIXED_PRECISION" and quant.get("group_size"):
        if str(quant.get("moe_quant_algo", "")).upper() == "NVFP4":
            return {"group_size": int(quant["group_size"]), "exclude_modules": list(quant.get("ignore") or [])}
    return None


def evaluate(server_args, model: ModelClass, sm: str, environment: dict | None = None) -> dict:
    """ServerArgs(...).__post_init__ for this class on this SM; the kernel choices it leaves."""
    config = _model_config(server_args, model)
    cls = server_args.ServerArgs
    with device(server_args, sm, environment), mock.patch.object(cls, "get_model_config", lambda self: config):
        # DeepSeek-V3's checkpoint header holds fp8 experts exactly when its quantization_config says so
        fp8_weights = (model.quantization_config or {}).get("quant_method") == "fp8"
        with mock.patch.object(server_args, "has_fp8_weights_in_checkpoint", lambda path: fp8_weights):
            args = cls(
                model_path=f"opcollect/{model.name}",
                tp_size=model.tp_size,
                ep_size=model.ep_size,
                kv_cache_dtype=model.kv_cache_dtype,
                quantization=model.quantization,
                skip_server_warmup=True,
            )
        if model.name.startswith("gemm/"):
            srt = Path(server_args.__file__).parent
            return {"quantization": args.quantization, **fp8_choices(srt, args, env(environment)["deep_gemm"])}
    prefill, decode = args.get_attention_backends()
    return {
        "attention_backend": args.attention_backend,
        "prefill_attention_backend": prefill,
        "decode_attention_backend": decode,
        "moe_runner_backend": args.moe_runner_backend,
        "quantization": args.quantization,
        "page_size": args.page_size,
    }


def tables(source: Path) -> dict:
    server_args = load_server_args(source)
    result: dict = {
        "version": VERSION,
        "generated_by": "scripts/selection_tables_sglang.py",
        "environment": dict(ENVIRONMENT),
        "sm": {},
    }
    for sm in SMS:
        rows = {}
        for model in model_classes():
            try:
                rows[model.name] = evaluate(server_args, model, sm)
            except (AssertionError, ValueError, NotImplementedError, AttributeError) as exc:
                rows[model.name] = {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        result["sm"][sm] = rows
    return result


def render(data: dict) -> str:
    head = (
        f"# SGLang {VERSION}'s own kernel choices per model class and SM, from ServerArgs.__post_init__ on a\n"
        "# device reporting that SM. Written by scripts/selection_tables_sglang.py; do not edit by hand.\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=None, help="the sglang wheel or an unpacked one")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    source = args.source or default_source()
    if source is None:
        print(f"no sglang-{VERSION} wheel in .cache/wheels: run `nox -s contract-sglang` or pass --source")
        return 2
    os.environ.setdefault("SGLANG_IS_FLASHINFER_AVAILABLE", "true")
    text = render(tables(source))
    if args.check:
        committed = args.out.read_text() if args.out.exists() else ""
        if committed != text:
            print(f"{args.out}: differs from what sglang {VERSION}'s selection code returns; rerun the script")
            return 1
        print(f"{args.out}: matches sglang {VERSION}'s selection code")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
