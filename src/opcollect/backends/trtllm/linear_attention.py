"""Gated DeltaNet (gdn_perf) and Mamba2 (mamba2_perf) on TensorRT-LLM's own layers: one kernel of one layer per row,
called as the layer's forward calls it, over state pools laid out as the mamba cache manager lays them out.

TensorRT-LLM is cited by symbol (no v1.3.0rc20 or rc23 checkout is in reach; the copies read are named in
tests/data/trtllm-release/README.md); linear_inputs has the layout and the pure rules.

Built: the layer serving builds, at one rank with the case's heads as its whole: Qwen3NextGatedDeltaNet(model_config,
aux_stream, layer_idx) for gdn (the GDN layer of Qwen3-Next and Qwen3.5, _torch/modules/mamba/gdn_mixer.py), from a
ModelConfig whose pretrained config holds the linear_* keys; Mamba2Mixer(d_model, d_state, d_conv, nheads, n_groups,
head_dim, chunk_size, layer_idx, dtype, config) for mamba2 (_torch/modules/mamba/mamba2_mixer.py, Nemotron-H's), conv
bias on and no projection bias as Nemotron-H's configs have them. Only conv1d's weights are created (the projections
are gemm_perf's rows); conv weight and bias, A_log / A, D and dt_bias are drawn at random and Mamba2Mixer's
post_load_weights expands A, D and dt_bias for the decode step as serving's load does.

Timed (each call exactly as the layer's forward makes it, the kernels looked up where the layer imports them):
- gdn context conv: gdn_mixer.causal_conv1d_fn over the packed q | k | v channels [conv_dim, T] with the layer's
  weight, bias (None) and activation, the conv-state pool, has_initial_state False, cache_indices and
  query_start_loc of batch_size prompts (Qwen3NextGatedDeltaNet.forward_extend);
- gdn context core: gdn_mixer.chunk_gated_delta_rule (which resolves FlashInfer's GDN prefill or the vendored
  Triton one as the installed layer does) on the q, k, v, g, beta the layer's post-conv step makes of a conv output
  (fused_gdn_post_conv where the installed layer has it: q and k L2-normalized, then use_qk_l2norm_in_kernel False;
  else the split conv output, fused_gdn_gating's g and sigmoid beta with the flag the installed forward_extend
  passes), cu_seqlens, head_first False, and the state pool: indexed in place (initial_state_indices,
  inplace_indexed_state_update) where the installed forward_extend does so, else the gathered states with
  output_final_state (read from the installed source, state_form);
- gdn generation conv: gdn_mixer.causal_conv1d_update on [batch_size, conv_dim] with conv_state_indices;
- gdn generation core: gdn_mixer.fused_sigmoid_gating_delta_rule_update (Qwen3NextGatedDeltaNet.forward_decode):
  q, k, v as views of the conv output, a and b as the [b | a] halves of in_proj_ba's output, A_log, dt_bias, the
  state pool and its indices, cu_seqlens, use_qk_l2norm_in_kernel True, softplus 1.0 / 20.0;
- mamba2 context conv: mamba2_mixer.causal_conv1d_fn over x | B | C [conv_dim, T] with weight and bias, activation
  silu, the conv-state pool, has_initial_state, query_start_loc and cache_indices (Mamba2Mixer.forward);
- mamba2 context core: mamba2_mixer.mamba_chunk_scan_combined on x [1, T, h, p], dt [1, T, h], B and C [1, T, g, n],
  the layer's A, D and dt_bias, chunk_size, dt_softplus, dt_limit (0, inf), cu_seqlens, seq_idx,
  return_varlen_states True, out, state_dtype the layer's SSM cache dtype (keywords the installed function lacks are
  not passed); the copy of the final states into the pool is a separate op, not timed;
- mamba2 generation conv: mamba2_mixer.causal_conv1d_update with conv_state_indices;
- mamba2 generation core: the layer's selective_state_update_func (FlashInfer's selective_state_update for the
  head_dim / head-group ratio / d_state it supports, else TensorRT-LLM's own, as Mamba2Mixer.__init__ picks) on the
  SSM pool, x [b, h, p], fp32 dt expanded per head_dim, B and C [b, g, n], the expanded A, D and dt_bias, dt_softplus,
  state_batch_indices and out.
torch_ops.check_installed refuses an install whose layers no longer make these calls.

kernel_source is the reference's label for the kernel of the row (linear_inputs.LABELS), whatever implementation
TensorRT-LLM picks beneath the call (the labels do not change by SM in the collector).

Deliberate differences from the reference collector (collector/trtllm/collect_gdn.py, collect_mamba2.py), none in the
key columns: it calls the kernels bare, on inputs of its own layout, where this times serving's calls: the GDN conv
convolves the packed 2 K + V channels without bias (the collector: the key channels only, with a bias, :157-168); the
GDN decode is serving's fused-gating step fused_sigmoid_gating_delta_rule_update over the indexed bf16 state pool
(the collector: fused_recurrent_gated_delta_rule on a gathered state, :561-606), labelled with the collector's name,
which the consumer folds into the same fused_sigmoid_gating_delta_rule_update at load; the GDN prefill scan takes
cu_seqlens and the pool (the collector: a padded batch with no state, :316-336); Mamba2's scan takes the varlen
batch serving passes (the collector's padded batch raises inside its try, so the reference has no such rows) and
its decode the layer's selective_state_update_func on [b, h, p] inputs. States are bf16 for GDN and the layer's
_mamba_ssm_cache_dtype (bf16 when unset, the model dtype) for Mamba2 (KvCacheConfig's "auto"). Inputs rotate over
`copies` sets with disjoint state slots, timed as every opcollect row (CUDA graph where the capture succeeds), not
the collector's 13-set pool with 3 + 10 iterations.
"""

from __future__ import annotations

import inspect
import math
from functools import lru_cache, partial
from types import SimpleNamespace

from opcollect.backends.trtllm import linear_inputs as inputs
from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.runtime.contract import KernelLimit, Prepared, Runner
from opcollect.runtime.timing import random_tensor

GDN_MIXER = ("_torch/modules/mamba/gdn_mixer.py",)


@lru_cache(maxsize=None)
def state_form() -> tuple[bool, bool]:
    """(the prefill scan updates the pool in place by index, q and k arrive L2-normalized) as the installed
    Qwen3NextGatedDeltaNet.forward_extend passes them (inplace_indexed_state_update=True and
    use_qk_l2norm_in_kernel=False in the copy read)."""
    root = torch_ops.installed_root()
    if root is None:
        raise KernelLimit("TensorRT-LLM's gdn runner: tensorrt_llm is not installed")
    found = torch_ops._source(root, GDN_MIXER, "Qwen3NextGatedDeltaNet.forward_extend")
    if isinstance(found, str):
        raise KernelLimit(f"TensorRT-LLM's gdn runner: {found}")
    body = found[1]
    return "inplace_indexed_state_update=True" in body, "use_qk_l2norm_in_kernel=False" in body


def accepted(fn, kwargs: dict) -> dict:
    """The keywords ``fn`` takes (all of them where it takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _scaled(shape, device: str, seed: int, scale: float):
    import torch

    return random_tensor(shape, torch.bfloat16, device, seed).mul_(scale)


def build_gdn(case, device: str):
    """Qwen3NextGatedDeltaNet at one rank, conv1d's weight drawn (no bias, as the layer is built)."""
    import torch
    from tensorrt_llm._torch.model_config import ModelConfig
    from tensorrt_llm._torch.modules.mamba.gdn_mixer import Qwen3NextGatedDeltaNet

    from opcollect.backends.trtllm.context import one_rank_mapping

    pretrained = SimpleNamespace(**inputs.gdn_config(case), torch_dtype=torch.bfloat16)
    config = ModelConfig(pretrained_config=pretrained, mapping=one_rank_mapping(), skip_create_weights_in_init=True)
    with torch.device(device):
        layer = Qwen3NextGatedDeltaNet(model_config=config, aux_stream=torch.cuda.Stream(device=device), layer_idx=0)
        layer.conv1d.create_weights()
    layer.to(device)
    with torch.no_grad():
        weight = layer.conv1d.weight
        weight.copy_(_scaled(tuple(weight.shape), device, 1, case.d_conv**-0.5))
    return layer


def build_mamba2(case, device: str):
    """Mamba2Mixer for the case's whole layer, conv1d's weight and bias, A < 0, D and dt_bias drawn, then
    post_load_weights (the decode step's expanded A, D and dt_bias)."""
    import torch
    from tensorrt_llm._torch.model_config import ModelConfig
    from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer

    from opcollect.backends.trtllm.context import one_rank_mapping

    config = ModelConfig(mapping=one_rank_mapping(), skip_create_weights_in_init=True)
    with torch.device(device):
        mixer = Mamba2Mixer(**inputs.mamba2_config(case), dtype=torch.bfloat16, config=config)
        mixer.conv1d.create_weights()
    mixer.to(device)
    with torch.no_grad():
        conv = mixer.conv1d
        conv.weight.copy_(_scaled(tuple(conv.weight.shape), device, 1, case.d_conv**-0.5))
        if conv.bias is not None:
            conv.bias.copy_(_scaled(tuple(conv.bias.shape), device, 2, 0.1))
        h = case.nheads
        mixer.A.copy_(-torch.linspace(1.0, 16.0, h, device=device))  # A = -exp(A_log), A_log in [0, log 16]
        mixer.D.copy_(random_tensor((h,), torch.float32, device, 3))
        mixer.dt_bias.copy_(random_tensor((h,), torch.float32, device, 4).sub_(4.0))
    mixer.post_load_weights()
    return mixer


def _pools(op: str, case, copies: int, device: str, ssm_dtype):
    import torch

    p = inputs.pools(op, case, copies)
    conv = torch.zeros((p.slots, *p.conv), dtype=torch.bfloat16, device=device)
    ssm = torch.zeros((p.slots, *p.ssm), dtype=ssm_dtype, device=device)
    slots = [torch.arange(*inputs.slot_range(case, i), dtype=torch.int32, device=device) for i in range(copies)]
    return conv, ssm, slots


def _starts(case, device: str):
    """query_start_loc (int32) and its int64 copy: batch_size requests of seq_len tokens."""
    import torch

    starts = torch.arange(case.batch_size + 1, dtype=torch.int32, device=device) * case.seq_len
    return starts, starts.long()


def _conv_call(op: str, module, layer, case, copies: int, device: str, conv, slots, activation: str):
    """The layer's conv kernel over its pool: context causal_conv1d_fn, generation causal_conv1d_update."""
    import torch

    channels = inputs.conv_dim(op, case)
    weight, bias = layer.conv1d.weight, layer.conv1d.bias
    if case.phase == "context":
        starts, _ = _starts(case, device)
        fresh = torch.zeros(case.batch_size, dtype=torch.bool, device=device)
        sets = [_scaled((channels, case.num_tokens), device, 10 + i, 1.0) for i in range(copies)]

        def run(i: int) -> None:
            module.causal_conv1d_fn(
                sets[i],
                weight,
                bias,
                activation=activation,
                conv_states=conv,
                has_initial_state=fresh,
                cache_indices=slots[i],
                query_start_loc=starts,
            )

        return run
    sets = [_scaled((case.batch_size, channels), device, 10 + i, 1.0) for i in range(copies)]

    def step(i: int) -> None:
        module.causal_conv1d_update(sets[i], conv, weight, bias, activation, conv_state_indices=slots[i])

    return step


def _gdn_prefill_inputs(gdn_mixer, layer, case, device: str, seed: int, normalized: bool):
    """q, k, v, g, beta of one prompt batch as the layer's post-conv step makes them of a conv output."""
    import torch

    t, nk, hk, nv, hv = case.num_tokens, case.num_k_heads, case.head_k_dim, case.num_v_heads, case.head_v_dim
    mixed_t = _scaled((inputs.conv_dim("gdn", case), t), device, seed, 1.0)
    ba = _scaled((t, 2 * nv), device, seed + 1, 1.0)
    b, a = ba[:, :nv], ba[:, nv:]
    post = getattr(gdn_mixer, "fused_gdn_post_conv", None)
    if normalized and post is not None:
        return post(mixed_t, None, a, b, layer.A_log, layer.dt_bias, nk, hk, nv, hv)
    if normalized:
        raise KernelLimit("the installed gdn_mixer passes normalized q and k but has no fused_gdn_post_conv")
    mixed = mixed_t.t()
    q = mixed[:, : nk * hk].reshape(1, t, nk, hk)
    k = mixed[:, nk * hk : 2 * nk * hk].reshape(1, t, nk, hk)
    v = mixed[:, 2 * nk * hk :].reshape(1, t, nv, hv)
    g = gdn_mixer.fused_gdn_gating(layer.A_log, a, layer.dt_bias).unsqueeze(0)
    return q, k, v, g, torch.sigmoid(b).unsqueeze(0)


def prepare_gdn(case, dispatch: str, device: str, copies: int) -> Prepared:
    inputs.check_case("gdn", case)
    torch_ops.check_installed("gdn")
    import tensorrt_llm._torch.modules.mamba.gdn_mixer as gdn_mixer
    import torch

    layer = build_gdn(case, device)
    conv, ssm, slots = _pools("gdn", case, copies, device, torch.bfloat16)
    label = inputs.label("gdn", case)
    if case.stage == "conv":
        run = _conv_call("gdn", gdn_mixer, layer, case, copies, device, conv, slots, layer.activation)
        return _prepared(run, copies, label)
    _, starts = _starts(case, device)
    nk, hk, nv, hv = case.num_k_heads, case.head_k_dim, case.num_v_heads, case.head_v_dim
    if case.phase == "context":
        indexed, normalized = state_form()
        sets = [_gdn_prefill_inputs(gdn_mixer, layer, case, device, 10 + 10 * i, normalized) for i in range(copies)]
        gathered = None if indexed else [ssm[s.long()] for s in slots]

        def scan(i: int) -> None:
            q, k, v, g, beta = sets[i]
            if indexed:
                state = {"initial_state": ssm, "initial_state_indices": slots[i], "inplace_indexed_state_update": True}
                state["output_final_state"] = False
            else:
                state = {"initial_state": gathered[i], "output_final_state": True}
            gdn_mixer.chunk_gated_delta_rule(
                q=q,
                k=k,
                v=v,
                g=g,
                beta=beta,
                cu_seqlens=starts,
                head_first=False,
                use_qk_l2norm_in_kernel=not normalized,
                **state,
            )

        return _prepared(scan, copies, label)
    b = case.batch_size
    key = nk * hk
    mixed = [_scaled((b, inputs.conv_dim("gdn", case)), device, 10 + i, 1.0) for i in range(copies)]
    ba = [_scaled((b, 2 * nv), device, 40 + i, 1.0) for i in range(copies)]

    def decode(i: int) -> None:
        x = mixed[i]
        gdn_mixer.fused_sigmoid_gating_delta_rule_update(
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            q=x[..., :key].view(1, b, nk, hk),
            k=x[..., key : 2 * key].view(1, b, nk, hk),
            v=x[..., 2 * key :].view(1, b, nv, hv),
            a=ba[i][:, nv:],
            b=ba[i][:, :nv],
            initial_state_source=ssm,
            initial_state_indices=slots[i],
            cu_seqlens=starts,
            use_qk_l2norm_in_kernel=True,
            softplus_beta=1.0,
            softplus_threshold=20.0,
        )

    return _prepared(decode, copies, label)


def prepare_mamba2(case, dispatch: str, device: str, copies: int) -> Prepared:
    inputs.check_case("mamba2", case)
    torch_ops.check_installed("mamba2")
    import tensorrt_llm._torch.modules.mamba.mamba2_mixer as mamba2_mixer
    import torch

    mixer = build_mamba2(case, device)
    cache_dtype = getattr(mixer, "_mamba_ssm_cache_dtype", None)
    ssm_dtype = cache_dtype if isinstance(cache_dtype, torch.dtype) else torch.bfloat16
    conv, ssm, slots = _pools("mamba2", case, copies, device, ssm_dtype)
    label = inputs.label("mamba2", case)
    if case.stage == "conv":
        run = _conv_call("mamba2", mamba2_mixer, mixer, case, copies, device, conv, slots, "silu")
        return _prepared(run, copies, label)
    b, t, h, p, g, n = case.batch_size, case.num_tokens, case.nheads, case.head_dim, case.n_groups, case.d_state
    if case.phase == "context":
        cu, _ = _starts(case, device)
        seq_idx = torch.repeat_interleave(torch.arange(b, dtype=torch.int32, device=device), case.seq_len).unsqueeze(0)
        scan_fn = mamba2_mixer.mamba_chunk_scan_combined

        def prompt(i: int) -> tuple:
            x = _scaled((1, t, h, p), device, 10 + 10 * i, 1.0)
            dt = _scaled((1, t, h), device, 11 + 10 * i, 1.0)
            bmat, cmat = (_scaled((1, t, g, n), device, seed + 10 * i, 1.0) for seed in (12, 13))
            return x, dt, bmat, cmat

        sets = [prompt(i) for i in range(copies)]
        outs = [torch.empty(1, t, h, p, dtype=torch.bfloat16, device=device) for _ in range(copies)]
        fixed = {
            "chunk_size": mixer.chunk_size,
            "D": mixer.D,
            "z": None,
            "dt_bias": mixer.dt_bias,
            "initial_states": None,  # fresh prompts: no cached prefix state
            "chunk_indices": None,
            "chunk_offsets": None,
            "dt_softplus": mixer.delta_softplus,
            "dt_limit": (0.0, math.inf),
            "cu_seqlens": cu,
            "seq_idx": seq_idx,
            "return_varlen_states": True,
            "return_final_states": False,
            "state_dtype": cache_dtype,
        }
        fixed = accepted(scan_fn, fixed)
        takes_out = "out" in accepted(scan_fn, {"out": None})

        def scan(i: int) -> None:
            x, dt, bmat, cmat = sets[i]
            extra = {"out": outs[i]} if takes_out else {}
            scan_fn(x, dt, mixer.A, bmat, cmat, **fixed, **extra)

        return _prepared(scan, copies, label)

    def token(i: int) -> tuple:
        x = _scaled((b, h, p), device, 10 + 10 * i, 1.0)
        dt = random_tensor((b, h), torch.float32, device, 11 + 10 * i).unsqueeze(-1).expand(b, h, p)
        return x, dt, _scaled((b, g, n), device, 12 + 10 * i, 1.0), _scaled((b, g, n), device, 13 + 10 * i, 1.0)

    sets = [token(i) for i in range(copies)]
    outs = [torch.empty(b, h, p, dtype=torch.bfloat16, device=device) for _ in range(copies)]
    update = mixer.selective_state_update_func

    def step(i: int) -> None:
        x, dt, bmat, cmat = sets[i]
        update(
            ssm,
            x,
            dt,
            mixer._A_expanded,
            bmat,
            cmat,
            mixer._D_expanded,
            z=None,
            dt_bias=mixer._dt_bias_expanded,
            dt_softplus=mixer.delta_softplus,
            state_batch_indices=slots[i],
            out=outs[i],
        )

    return _prepared(step, copies, label)


def _prepared(run, copies: int, label: str) -> Prepared:
    state = {"i": 0}

    def call() -> None:
        import torch

        i = state["i"] = (state["i"] + 1) % copies
        with torch.inference_mode():
            run(i)

    return Prepared(call, label)


RUNNERS = {
    "gdn": (Runner(partial(inputs.footprint, "gdn"), prepare_gdn, versions=SERVED_VERSIONS),),
    "mamba2": (Runner(partial(inputs.footprint, "mamba2"), prepare_mamba2, versions=SERVED_VERSIONS),),
}
