"""Whether a config.json's ``quantization_config`` serves the linear layers with static per-tensor FP8 activations.

Such a model quantizes every linear layer's bf16 input x[m, k] with a scale stored in the checkpoint (scale_matrix)
instead of computing one per token (compute_scale), so its layers' input widths k join the quantize sweeps. The
frameworks read three formats as static per-tensor FP8 activations (vLLM 0.24.0 and SGLang 0.5.14 agree):

- ``quant_method: fp8`` with ``activation_scheme: static`` (vLLM model_executor/layers/quantization/fp8.py:94-173
  Fp8Config, :299 and :315-316 act_q_static -> kFp8StaticTensorSym; SGLang srt/layers/quantization/fp8.py:153-248,
  :488-506 input_scale). Block-wise weights (weight_block_size) take dynamic activations only: vLLM asserts it
  (fp8.py:301-302), SGLang raises (fp8.py:190-192).
- ``quant_method: modelopt`` with ``quant_algo: FP8`` (top level, or under ``quantization`` as the legacy
  hf_quant_config.json has it; vLLM modelopt.py:245-262 and :280-320): ModelOptFp8LinearMethod registers an
  input_scale and quantizes activations with kFp8StaticTensorSym (modelopt.py:443-511).
  FP8_PER_CHANNEL_PER_TOKEN and FP8_PB_WO are dynamic or weight-only (modelopt.py:391-400, :545).
- ``quant_method: compressed-tensors`` with a config group of 8-bit float weights and 8-bit float input activations
  that are not dynamic, per tensor (vLLM compressed_tensors/compressed_tensors.py:524-558 _is_fp8_w8a8 and :757-768
  is_static_input_scheme; SGLang compressed_tensors/compressed_tensors.py:403-437, :586). compressed-tensors'
  QuantizationArgs defaults: type int, num_bits 8, dynamic false, symmetric true, strategy tensor.
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.errors import InputError

FP8 = "fp8"
MODELOPT = "modelopt"
COMPRESSED_TENSORS = "compressed-tensors"


class QuantizeShape(NamedTuple):
    k: int  # a linear layer's input width on one rank


def _text(value: object) -> str:
    return value.strip().lower() if isinstance(value, str) else ""


def _float8(args: object) -> bool:
    """An 8-bit float QuantizationArgs of compressed-tensors (type defaults to int, num_bits to 8)."""
    return isinstance(args, dict) and _text(args.get("type")) == "float" and args.get("num_bits", 8) == 8


def _static_tensor(args: dict) -> bool:
    strategy = _text(args.get("strategy")) or "tensor"
    return not args.get("dynamic", False) and strategy == "tensor" and args.get("symmetric", True) is not False


def static_fp8(source: str, config: object) -> str | None:
    """The format ("fp8", "modelopt", "compressed-tensors") in which ``config``, a quantization_config, serves linear
    layers with static per-tensor FP8 activations; None when it does not (absent, dynamic, weight-only, other)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise InputError(
            f"{source}: field 'quantization_config' is a {type(config).__name__}; it is a JSON object, as "
            "config.json holds it (or leave it out for an unquantized model)"
        )
    method = _text(config.get("quant_method"))
    if method == FP8:
        if _text(config.get("activation_scheme")) != "static":
            return None
        if config.get("weight_block_size"):
            raise InputError(
                f"{source}: quantization_config has activation_scheme static with weight_block_size; block-wise "
                "fp8 takes dynamic activations only (vLLM and SGLang refuse this); set activation_scheme dynamic"
            )
        return FP8
    if method.startswith(MODELOPT):
        nested = config.get("quantization")
        algo = nested.get("quant_algo") if isinstance(nested, dict) else config.get("quant_algo")
        return MODELOPT if isinstance(algo, str) and algo.strip().upper() == "FP8" else None
    if method == COMPRESSED_TENSORS:
        groups = config.get("config_groups")
        for group in groups.values() if isinstance(groups, dict) else ():
            if not isinstance(group, dict):
                continue
            weights, inputs = group.get("weights"), group.get("input_activations")
            if _float8(weights) and _float8(inputs) and _static_tensor(inputs):
                return COMPRESSED_TENSORS
    return None


def quantize_shapes(static: str | None, linear_inputs: set[int]) -> frozenset[QuantizeShape]:
    """The quantize shapes of a model: the input width of each of its linear layers on one rank, when it serves
    them with static FP8 activations (the hidden size, the attention output and the MLP's intermediate size per
    TP size, and MLA's latent ranks); none otherwise."""
    if static is None:
        return frozenset()
    return frozenset(QuantizeShape(k) for k in linear_inputs)
