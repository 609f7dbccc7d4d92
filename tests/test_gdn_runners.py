"""The Gated DeltaNet runners of vLLM and SGLang (backends/{vllm,sglang}/gdn.py) against stand-ins for the frameworks up
to their kernel calls: each stand-in checks its inputs as the framework function does (the cited checks), computes with
the torch reference (backends/torch/linear_attention.py) where a later call reads its result, and records what it was
given. Checked: which framework function each row's call runs, with the shapes, strides, dtypes and arguments serving
passes; the state caches laid out as serving lays them out (vLLM's pages of strided views, SGLang's pool slices) and
touched only at the requests' slots; the labels (vLLM's prefill label from the backend ChunkGatedDeltaRule chose); the
refusals before any framework import. Where .cache/wheels holds the pinned wheels, every framework symbol the runners
import resolves in them."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
from conftest import ROOT, install_fakes
from fake_frameworks import Recorder

from opcollect.backends import kernels as kt
from opcollect.backends.sglang import gdn as sgl
from opcollect.backends.torch import linear_attention as la
from opcollect.backends.vllm import context as vllm_context_module
from opcollect.backends.vllm import gdn as vll
from opcollect.plans.linear_attention import GdnCase
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

WHEELS = ROOT / ".cache" / "wheels"
NK, HK, NV, HV, W = 2, 16, 4, 8, 4  # key heads, key dim, value heads, value dim, conv taps
CONV, VALUE = 2 * NK * HK + NV * HV, NV * HV


def case(stage="conv", phase="context", batch=3, seq=5, nk=NK, nv=NV, d_conv=W) -> GdnCase:
    seq = seq if phase == "context" else 1
    return GdnCase(stage, phase, batch, seq, batch * seq, 1024, d_conv, nk, HK, nv, HV, "Qwen/Qwen3.5-27B")


def conv_reference(x, state, weight):
    """The causal conv of one request x [dim, s] from its state [dim, width - 1]: output and the new state."""
    window = torch.cat([state.float(), x.float()], dim=-1)
    out = torch.nn.functional.conv1d(window[None], weight.float()[:, None], groups=x.shape[0])[0]
    return torch.nn.functional.silu(out), window[:, -state.shape[-1] :]


# ---------------------------------------------------------------- vLLM


class FakeVllm(Recorder):
    def __init__(self, capability=90):
        super().__init__()
        self.capability = capability
        self.configs: list = []

    def install(self, monkeypatch) -> None:
        fake = self

        class MambaStateShapeCalculator:  # model_executor/layers/mamba/mamba_utils.py:213-234, SD layout (:140-144)
            @classmethod
            def gated_delta_net_state_shape(cls, tp, nk, nv, hk, hv, width, num_spec=0):
                return (width - 1 + num_spec, (hk * nk * 2 + hv * nv) // tp), (nv // tp, hv, hk)

        class MambaStateDtypeCalculator:  # :83-95, :107-116
            @classmethod
            def gated_delta_net_state_dtype(cls, model_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype="auto"):
                assert mamba_cache_dtype == "auto"
                return model_dtype, {"float32": torch.float32}[mamba_ssm_cache_dtype]

        class MambaSpec:  # v1/kv_cache_interface.py:629-646
            def __init__(self, shapes, dtypes, block_size, page_size_padded=None):
                self.shapes, self.dtypes, self.block_size = shapes, dtypes, block_size

            @property
            def page_size_bytes(self):
                return sum(torch.Size(s).numel() * d.itemsize for s, d in zip(self.shapes, self.dtypes))

        def compute_causal_conv1d_metadata(starts_cpu, *, device):  # v1/attention/backends/utils.py:810-856
            assert starts_cpu.device.type == "cpu"
            fake.calls.append(("conv_metadata", starts_cpu.clone()))
            return {8: {"tot": 1}}, torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)

        def causal_conv1d_fn(
            x,
            weight,
            bias,
            conv_states,
            query_start_loc,
            cache_indices=None,
            has_initial_state=None,
            activation="silu",
            metadata=None,
            **kw,
        ):
            # causal_conv1d.py:468-660: x (dim, tokens) channel-last, states (..., dim, width - 1)
            assert x.stride(0) == 1 and x.stride(1) > 1, "Need to run in channel-last layout"
            dim, width = weight.shape
            assert conv_states.shape[1] == dim and conv_states.shape[2] >= width - 1 and weight.stride(1) == 1
            assert cache_indices.shape == has_initial_state.shape == (query_start_loc.numel() - 1,)
            fake.record("conv_fn", x=x, weight=weight, bias=bias, states=conv_states, starts=query_start_loc,
                        indices=cache_indices, initial=has_initial_state, act=activation, metadata=metadata,
                        kw=kw)  # fmt: skip
            out = torch.empty_like(x)
            starts = query_start_loc.tolist()
            for r, slot in enumerate(cache_indices.tolist()):
                seg = x[:, starts[r] : starts[r + 1]]
                state = torch.zeros(dim, width - 1) if not has_initial_state[r] else conv_states[slot]
                o, conv_states[slot] = conv_reference(seg, state, weight)
                out[:, starts[r] : starts[r + 1]] = o.to(out.dtype)
            return out

        def causal_conv1d_update(
            x, conv_state, weight, bias=None, activation=None, conv_state_indices=None, validate_data=False, **kw
        ):
            # causal_conv1d.py:1069-1160: x (batch, dim) overwritten with the output
            assert x.stride(1) == 1 and conv_state.shape[1] == x.shape[1] == weight.shape[0]
            assert conv_state_indices.shape == (x.shape[0],)
            fake.record("conv_update", x=x, states=conv_state, indices=conv_state_indices, bias=bias,
                        act=activation, validate=validate_data, kw=kw)  # fmt: skip
            for r, slot in enumerate(conv_state_indices.tolist()):
                o, conv_state[slot] = conv_reference(x[r][:, None], conv_state[slot], weight)
                x[r] = o[:, 0].to(x.dtype)
            return x

        def packed_decode(
            mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel=False
        ):
            # fla/ops/fused_recurrent.py:339-428: the ValueErrors the kernel raises, then the step per slot
            assert mixed_qkv.ndim == 2 and mixed_qkv.stride(-1) == 1 and a.stride(-1) == 1 and b.stride(-1) == 1
            assert A_log.ndim == dt_bias.ndim == 1 and initial_state.ndim == 4 and initial_state.stride(-1) == 1
            assert out.is_contiguous() and ssm_state_indices.shape == (mixed_qkv.shape[0],)
            hv, v, k = initial_state.shape[-3:]
            assert out.shape == (mixed_qkv.shape[0], 1, hv, v) and a.shape == b.shape == (mixed_qkv.shape[0], hv)
            h = (mixed_qkv.shape[1] - hv * v) // 2 // k
            fake.record("packed_decode", qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                        state=initial_state, out=out, indices=ssm_state_indices,
                        l2=use_qk_l2norm_in_kernel)  # fmt: skip
            rows = ssm_state_indices.long()
            q, kk, vv = mixed_qkv.float().split([h * k, h * k, hv * v], dim=-1)
            q, kk = la.l2_normalize(q.view(-1, h, k)), la.l2_normalize(kk.view(-1, h, k))
            g = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
            state = initial_state[rows].transpose(-1, -2).contiguous()  # [b, HV, K, V] for the reference
            o = la.gdn_step(q, kk, vv.view(-1, hv, v), g, torch.sigmoid(b.float()), state, scale)
            initial_state[rows] = state.transpose(-1, -2)
            out.copy_(o[:, None].to(out.dtype))

        class ChunkGatedDeltaRule(torch.nn.Module):  # gdn/qwen_gdn_linear_attn.py:291-311 with the resolver :150-211
            def __init__(self):
                super().__init__()
                config = fake.configs[-1]
                head_k = config.model_config.hf_text_config.linear_key_head_dim
                flashinfer = fake.capability == 90 or (fake.capability == 100 and head_k == 128)
                self.gdn_prefill_backend = "flashinfer" if flashinfer else "triton"

            def forward(self, **kw):
                fake.record("chunk", **kw)

        def prepare_chunk_indices(cu_seqlens, chunk_size):  # fla/ops/index.py:23-30
            assert cu_seqlens.device.type == "cpu"
            return torch.tensor(
                [[r, c] for r, n in enumerate(cu_seqlens.diff().tolist()) for c in range(-(-n // chunk_size))],
                dtype=cu_seqlens.dtype,
            )

        def prepare_chunk_offsets(cu_seqlens, chunk_size):
            return torch.cat([cu_seqlens.new_tensor([0]), (-(-cu_seqlens.diff() // chunk_size))]).cumsum(-1)

        @contextlib.contextmanager
        def vllm_context(device, quant_config=None, max_num_batched_tokens=None):
            config = SimpleNamespace(model_config=vllm_context_module.model_stand_in(torch.bfloat16))
            fake.configs.append(config)
            yield config

        install_fakes(
            monkeypatch,
            {
                "vllm.model_executor.layers.mamba.mamba_utils": {
                    "MambaStateShapeCalculator": MambaStateShapeCalculator,
                    "MambaStateDtypeCalculator": MambaStateDtypeCalculator,
                },
                "vllm.v1.kv_cache_interface": {"MambaSpec": MambaSpec},
                "vllm.v1.attention.backends.gdn_attn": {"GDNAttentionMetadata": SimpleNamespace},
                "vllm.v1.attention.backends.utils": {"compute_causal_conv1d_metadata": compute_causal_conv1d_metadata},
                "vllm.model_executor.layers.mamba.ops.causal_conv1d": {
                    "causal_conv1d_fn": causal_conv1d_fn,
                    "causal_conv1d_update": causal_conv1d_update,
                },
                "vllm.model_executor.layers.fla.ops": {"fused_recurrent_gated_delta_rule_packed_decode": packed_decode},
                "vllm.model_executor.layers.fla.ops.index": {
                    "prepare_chunk_indices": prepare_chunk_indices,
                    "prepare_chunk_offsets": prepare_chunk_offsets,
                },
                "vllm.model_executor.layers.fla.ops.utils": {"FLA_CHUNK_SIZE": 64},
                "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn": {
                    "ChunkGatedDeltaRule": ChunkGatedDeltaRule
                },
            },
        )
        monkeypatch.setattr(vllm_context_module, "vllm_context", vllm_context)


@pytest.fixture
def fake_vllm(monkeypatch):
    return FakeVllm.installed(monkeypatch)


def page_elements(c, size: int) -> int:
    return vll.page_bytes(c) // size


def test_vllm_prefill_conv_runs_causal_conv1d_fn_on_serving_split_and_pages(fake_vllm):
    c = case("conv", "context", batch=3, seq=5)
    prepared = vll.prepare(c, "causal_conv1d_fn", "cpu", 2)
    assert prepared.kernel_source == "causal_conv1d_fn" and fake_vllm.of("conv_fn") == []
    for _ in range(3):
        prepared.call()
    calls = fake_vllm.of("conv_fn")
    assert len(calls) == 3 and calls[0]["states"] is not calls[1]["states"] and calls[2]["states"] is calls[0]["states"]
    first = calls[0]
    # the q | k | v split of the in_proj_qkvz output, transposed: rows of conv_dim + value_dim (forward_cuda :936-940)
    assert tuple(first["x"].shape) == (CONV, c.num_tokens) and first["x"].stride() == (1, CONV + VALUE)
    assert first["x"].dtype == torch.bfloat16 and first["bias"] is None and first["act"] == "silu"
    assert tuple(first["weight"].shape) == (CONV, W) and first["weight"].is_contiguous()
    # the conv state of batch + 1 pages, transposed to (dim, width - 1), page-strided (gpu_model_runner.py:7160-7180)
    states = first["states"]
    assert tuple(states.shape) == (c.batch_size + 1, CONV, W - 1) and states.dtype == torch.bfloat16
    assert states.stride() == (page_elements(c, 2), 1, CONV)
    assert first["indices"].tolist() == [1, 2, 3] and first["indices"].dtype == torch.int32
    assert first["initial"].tolist() == [False] * 3 and first["starts"].tolist() == [0, 5, 10, 15]
    assert first["metadata"].nums_dict == {8: {"tot": 1}} and first["metadata"].num_prefills == 3
    assert first["kw"] == {}
    # the launch lists are computed once for the batch, on the host, outside the timed calls
    [starts] = fake_vllm.of("conv_metadata")
    assert starts.tolist() == [0, 5, 10, 15]
    # each request's final conv state lands in its block; the null block 0 stays untouched
    assert states[0].abs().sum() == 0 and all(states[s].abs().sum() > 0 for s in (1, 2, 3))
    x = first["x"]
    want, final = conv_reference(x[:, 10:15], torch.zeros(CONV, W - 1), first["weight"])
    assert torch.allclose(states[3].float(), final, atol=1e-2)


@pytest.mark.parametrize(
    "capability, head_k, backend", [(90, 16, "flashinfer"), (100, 16, "triton"), (89, 16, "triton")]
)
def test_vllm_prefill_scan_calls_chunk_gated_delta_rule_and_labels_its_backend(
    monkeypatch, capability, head_k, backend
):
    fake = FakeVllm.installed(monkeypatch, capability)
    c = case("core", "context", batch=2, seq=70)
    prepared = vll.prepare(c, "x", "cpu", 1)
    assert prepared.kernel_source == f"chunk_gated_delta_rule_{backend}"
    assert fake.configs[-1].model_config.hf_text_config.linear_key_head_dim == HK  # the resolver's key
    prepared.call()
    [kw] = fake.of("chunk")
    t = c.num_tokens
    assert tuple(kw["q"].shape) == tuple(kw["k"].shape) == (1, t, NK, HK) and tuple(kw["v"].shape) == (1, t, NV, HV)
    assert all(kw[n].dtype == torch.bfloat16 and kw[n].is_contiguous() for n in ("q", "k", "v"))
    assert torch.allclose(kw["q"].float().norm(dim=-1), torch.ones(1, t, NK), atol=1e-2)  # pre-normalized
    assert kw["use_qk_l2norm_in_kernel"] is False and kw["output_final_state"] is True
    assert kw["g"].dtype == kw["beta"].dtype == torch.float32 and tuple(kw["g"].shape) == (1, t, NV)
    assert (kw["g"] < 0).all() and ((kw["beta"] > 0) & (kw["beta"] < 1)).all()
    assert tuple(kw["initial_state"].shape) == (2, NV, HV, HK) and kw["initial_state"].abs().sum() == 0
    assert kw["cu_seqlens"].tolist() == [0, 70, 140]
    # the builder's chunk lists: two chunks of 64 for each 70-token prompt
    assert kw["chunk_indices"].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]] and kw["chunk_offsets"].tolist() == [
        0,
        2,
        4,
    ]


def test_vllm_decode_conv_then_packed_step_read_the_paged_states_in_place(fake_vllm):
    conv_case, core_case = case("conv", "generation", batch=3), case("core", "generation", batch=3)
    conv = vll.prepare(conv_case, "causal_conv1d_update", "cpu", 1)
    assert conv.kernel_source == "causal_conv1d_update"
    conv.call()
    [update] = fake_vllm.of("conv_update")
    assert update["x"].stride() == (CONV + VALUE, 1) and tuple(update["x"].shape) == (3, CONV)
    assert update["validate"] is False and update["bias"] is None and update["act"] == "silu"  # serving's call
    assert update["indices"].tolist() == [1, 2, 3] and update["states"].stride() == (
        page_elements(conv_case, 2),
        1,
        CONV,
    )
    core = vll.prepare(core_case, "fused_recurrent_gated_delta_rule_packed_decode", "cpu", 1)
    assert core.kernel_source == "fused_recurrent_gated_delta_rule_packed_decode"
    core.call()
    [step] = fake_vllm.of("packed_decode")
    state = step["state"]
    assert tuple(state.shape) == (4, NV, HV, HK) and state.dtype == torch.float32
    assert state.stride() == (page_elements(core_case, 4), HV * HK, HK, 1)
    assert step["qkv"].stride() == (CONV + VALUE, 1) and step["l2"] is True and step["scale"] == HK**-0.5
    assert step["A_log"].dtype == torch.float32 and step["dt_bias"].dtype == torch.bfloat16
    assert step["a"].dtype == step["b"].dtype == torch.bfloat16 and step["indices"].tolist() == [1, 2, 3]
    assert step["out"].is_contiguous() and tuple(step["out"].shape) == (3, 1, NV, HV)
    # the step updates the requests' blocks in place and leaves the null block as it was
    before = state.clone()
    core.call()
    assert torch.equal(state[0], before[0]) and all(not torch.equal(state[s], before[s]) for s in (1, 2, 3))


def test_vllm_pages_hold_each_blocks_states_apart():
    c = case("core", "generation", batch=2)
    shapes = ((W - 1, CONV), (NV, HV, HK))
    page = vll.page_bytes(c)
    raw = torch.zeros(3 * page, dtype=torch.int8)
    conv, ssm = vll.state_views(raw, shapes, (torch.bfloat16, torch.float32), page, 3)
    assert tuple(conv.shape) == (3, W - 1, CONV) and tuple(ssm.shape) == (3, NV, HV, HK)
    for block in range(3):
        conv[block].fill_(block + 1)
        ssm[block].fill_(-(block + 1))
    for block in range(3):  # every byte of a page belongs to its block, conv state first
        page_bytes = raw[block * page : (block + 1) * page]
        split = (W - 1) * CONV * 2
        assert (page_bytes[:split].view(torch.bfloat16) == block + 1).all()
        assert (page_bytes[split:].view(torch.float32) == -(block + 1)).all()


def test_vllm_refusals_come_before_any_framework_import():
    with pytest.raises(KernelLimit, match="grid-y"):
        vll.prepare(case("core", "generation", batch=1024, nk=16, nv=64), "x", "cpu", 1)
    with pytest.raises(KernelLimit, match="d_conv 1"):
        vll.prepare(case(d_conv=1), "x", "cpu", 1)
    vll.check_case(case("conv", "generation", batch=1024, nk=16, nv=64))  # the conv has no grid-y limit


@pytest.mark.parametrize("module", [vll, sgl], ids=["vllm", "sglang"])
def test_value_heads_must_group_over_the_key_heads_before_any_framework_import(module):
    """GQA-style value heads: each key head serves num_v_heads / num_k_heads value heads, so 6 over 4 is no layer
    (refused as kernel_limit before anything is built) and 8 over 4 is one."""
    with pytest.raises(KernelLimit, match="6 value heads are no multiple of 4 key heads"):
        module.prepare(case(nk=4, nv=6), "x", "cpu", 1)
    module.check_case(case(nk=4, nv=8))


# ---------------------------------------------------------------- SGLang


class FakeSglang(Recorder):
    def __init__(self, packed=True):
        super().__init__()
        self.packed = packed

    def install(self, monkeypatch) -> None:
        fake = self

        class Mamba2StateShape:  # srt/configs/mamba_utils.py:129-180
            @staticmethod
            def create(*, tp_world_size, intermediate_size, n_groups, num_heads, head_dim, state_size, conv_kernel):
                conv_dim = intermediate_size + 2 * n_groups * state_size
                return SimpleNamespace(
                    conv=[(conv_dim // tp_world_size, conv_kernel - 1)],
                    temporal=(num_heads // tp_world_size, head_dim, state_size),
                )

        def mamba2_state_dtype(config=None):  # :39-94
            return SimpleNamespace(conv=torch.bfloat16, temporal={"float32": torch.float32}[config.mamba_ssm_dtype])

        def causal_conv1d_fn(
            x,
            weight,
            bias=None,
            query_start_loc=None,
            cache_indices=None,
            has_initial_state=None,
            conv_states=None,
            activation="silu",
            **kwargs,
        ):
            # mamba/causal_conv1d.py:32-91: a strided x with seq_lens_cpu runs the Triton kernel
            assert x.stride(-1) != 1 and "seq_lens_cpu" in kwargs
            fake.record("conv_fn", x=x, states=conv_states, indices=cache_indices, initial=has_initial_state,
                        starts=query_start_loc, bias=bias, act=activation, kw=kwargs)  # fmt: skip
            return torch.empty_like(x)

        def causal_conv1d_update(
            x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None, **kw
        ):
            fake.record("conv_update", x=x, states=conv_state, indices=conv_state_indices, bias=bias, act=activation)
            return x

        class TritonGDNKernel:  # linear/kernels/gdn_triton.py:38-156
            supports_packed_decode = fake.packed

            def packed_decode(
                self,
                mixed_qkv,
                a,
                b,
                *,
                A_log,
                dt_bias,
                scale,
                ssm_states,
                cache_indices,
                num_v_heads,
                head_v_dim,
                **kwargs,
            ):
                fake.record("packed_decode", qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                            state=ssm_states, indices=cache_indices, heads=(num_v_heads, head_v_dim))  # fmt: skip
                return mixed_qkv.new_empty(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim).transpose(0, 1)

            def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **kwargs):
                fake.record("extend", q=q, k=k, v=v, g=g, beta=beta, state=ssm_states, indices=cache_indices,
                            starts=query_start_loc)  # fmt: skip
                return None, None, None

        install_fakes(
            monkeypatch,
            {
                "sglang.srt.configs.mamba_utils": {
                    "Mamba2StateShape": Mamba2StateShape,
                    "mamba2_state_dtype": mamba2_state_dtype,
                },
                "sglang.srt.layers.attention.mamba.causal_conv1d": {"causal_conv1d_fn": causal_conv1d_fn},
                "sglang.srt.layers.attention.mamba.causal_conv1d_triton": {
                    "causal_conv1d_update": causal_conv1d_update
                },
                "sglang.srt.layers.attention.linear.kernels.gdn_triton": {"TritonGDNKernel": TritonGDNKernel},
            },
        )


@pytest.fixture
def fake_sglang(monkeypatch):
    return FakeSglang.installed(monkeypatch)


def test_sglang_prefill_conv_and_scan_as_forward_extend_calls_them(fake_sglang):
    c = case("conv", "context", batch=2, seq=6)
    prepared = sgl.prepare(c, "causal_conv1d_fn", "cpu", 2)
    assert prepared.kernel_source == "causal_conv1d_fn"
    prepared.call()
    [conv] = fake_sglang.of("conv_fn")
    assert tuple(conv["x"].shape) == (CONV, 12) and conv["x"].stride() == (1, CONV)  # the contiguous packed qkv
    assert tuple(conv["states"].shape) == (3, CONV, W - 1) and conv["states"].is_contiguous()
    assert conv["states"].dtype == torch.bfloat16 and conv["indices"].tolist() == [0, 1]
    assert conv["initial"].tolist() == [False, False] and conv["starts"].tolist() == [0, 6, 12]
    assert conv["kw"] == {"seq_lens_cpu": [6, 6]} and conv["bias"] is None and conv["act"] == "silu"
    scan = sgl.prepare(case("core", "context", batch=2, seq=6), "chunk_gated_delta_rule", "cpu", 1)
    assert scan.kernel_source == "chunk_gated_delta_rule"
    scan.call()
    [ext] = fake_sglang.of("extend")
    assert tuple(ext["q"].shape) == (1, 12, NK, HK) and tuple(ext["v"].shape) == (1, 12, NV, HV)
    assert ext["g"].dtype == ext["beta"].dtype == torch.float32 and tuple(ext["beta"].shape) == (1, 12, NV)
    assert tuple(ext["state"].shape) == (3, NV, HV, HK) and ext["state"].dtype == torch.float32
    assert ext["state"].abs().sum() == 0 and ext["indices"].tolist() == [0, 1]


def test_sglang_decode_conv_then_packed_decode_on_the_pools(fake_sglang):
    conv = sgl.prepare(case("conv", "generation", batch=3), "causal_conv1d_update", "cpu", 1)
    assert conv.kernel_source == "causal_conv1d_update"
    conv.call()
    [update] = fake_sglang.of("conv_update")
    assert tuple(update["x"].shape) == (3, CONV) and update["x"].is_contiguous() and update["act"] == "silu"
    assert tuple(update["states"].shape) == (4, CONV, W - 1) and update["states"].abs().sum() > 0  # earlier state
    core = sgl.prepare(case("core", "generation", batch=3), "x", "cpu", 1)
    assert core.kernel_source == "fused_recurrent_gated_delta_rule_packed_decode"
    core.call()
    [step] = fake_sglang.of("packed_decode")
    assert step["state"].dtype == torch.float32 and tuple(step["state"].shape) == (4, NV, HV, HK)
    assert step["A_log"].dtype == torch.float32 and step["dt_bias"].dtype == torch.bfloat16
    assert step["scale"] == HK**-0.5 and step["heads"] == (NV, HV) and step["indices"].tolist() == [0, 1, 2]


def test_sglang_refuses_int32_offsets_grid_y_and_a_kernel_without_packed_decode(monkeypatch):
    big = case("conv", "context", batch=64, seq=32768, nk=16, nv=64)  # 2M tokens x wide channels >= 2^31 elements
    for stage in ("conv", "core"):
        with pytest.raises(KernelLimit, match="int32"):
            sgl.prepare(big._replace(stage=stage, head_k_dim=128, head_v_dim=128), "x", "cpu", 1)
    with pytest.raises(KernelLimit, match="grid-y"):
        sgl.prepare(case("core", "generation", batch=1024, nk=16, nv=64), "x", "cpu", 1)
    FakeSglang.installed(monkeypatch, packed=False)
    with pytest.raises(KernelLimit, match="packed decode"):
        sgl.prepare(case("core", "generation"), "x", "cpu", 1)


# ---------------------------------------------------------------- both


@pytest.mark.parametrize("module", [vll, sgl])
def test_footprint_grows_with_the_case(module):
    for stage in ("conv", "core"):
        for phase in ("context", "generation"):
            small, large = case(stage, phase, batch=2), case(stage, phase, batch=8)
            assert 0 < module.footprint(small) < module.footprint(large)
    assert module.footprint(case("core", "context", seq=64)) > module.footprint(case("core", "context", seq=8))


def test_the_gdn_labels_name_their_kernels():
    op = "gdn"
    for backend in ("vllm", "sglang"):
        assert not kt.contradicts_label(backend, "causal_conv1d_fn", ["_causal_conv1d_fwd_kernel"], op)
        assert kt.contradicts_label(backend, "causal_conv1d_fn", ["_causal_conv1d_update_kernel"], op)
        assert not kt.contradicts_label(backend, "causal_conv1d_update", ["_causal_conv1d_update_kernel"], op)
        decode = "fused_recurrent_gated_delta_rule_packed_decode"
        assert not kt.contradicts_label(backend, decode, [f"{decode}_kernel"], op)
        assert kt.contradicts_label(backend, decode, ["fused_recurrent_gated_delta_rule_fwd_kernel"], op)
    fla = ["chunk_local_cumsum_scalar_kernel", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"]
    assert not kt.contradicts_label("sglang", "chunk_gated_delta_rule", fla, op)
    assert not kt.contradicts_label("vllm", "chunk_gated_delta_rule_triton", fla, op)
    flat = "void cutlass::device_kernel<flat::kernel::FlatKernelTmaWarpSpecializedDeltaRule<...>>(...)"
    assert not kt.contradicts_label("vllm", "chunk_gated_delta_rule_flashinfer", ["exp_kernel", flat], op)
    assert kt.contradicts_label("vllm", "chunk_gated_delta_rule_flashinfer", fla, op)


@pytest.mark.parametrize(
    "backend, wheels",
    [("vllm", ("vllm-0.24.0-*.whl",)), ("sglang", ("sglang-0.5.14-*.whl", "sglang_kernel-0.4.4-*.whl"))],
)
def test_the_contract_check_covers_every_symbol_the_gdn_runner_imports(backend, wheels):
    from opcollect.backends.symbols import FRAMEWORK_PACKAGES, Release, check, runner_uses

    backends = ROOT / "src" / "opcollect" / "backends"
    uses = [
        u for u in runner_uses(backends / backend, FRAMEWORK_PACKAGES[backend], ROOT) if f"/{backend}/gdn" in u.where
    ]
    labels = {u.label for u in uses}
    want = {
        "vllm": {
            "vllm.model_executor.layers.mamba.ops.causal_conv1d.causal_conv1d_fn",
            "vllm.model_executor.layers.mamba.ops.causal_conv1d.causal_conv1d_update",
            "vllm.model_executor.layers.fla.ops.fused_recurrent_gated_delta_rule_packed_decode",
            "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn.ChunkGatedDeltaRule",
            "vllm.v1.attention.backends.gdn_attn.GDNAttentionMetadata",
            "vllm.v1.kv_cache_interface.MambaSpec",
        },
        "sglang": {
            "sglang.srt.layers.attention.mamba.causal_conv1d.causal_conv1d_fn",
            "sglang.srt.layers.attention.mamba.causal_conv1d_triton.causal_conv1d_update",
            "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel",
            "sglang.srt.configs.mamba_utils.Mamba2StateShape",
        },
    }[backend]
    assert want <= labels, want - labels
    found = [sorted(WHEELS.glob(pattern)) for pattern in wheels]
    if all(found):
        assert check(uses, Release(*(f[-1] for f in found))) == []


def test_vllm_and_sglang_gdn_are_planned_with_runners_for_every_dispatch(planner):
    from opcollect.backends import load_backend
    from opcollect.images.pins import load_pins
    from opcollect.plans.planner import PlanOptions

    want = {
        "vllm": {"causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule_flashinfer", vll.PACKED_DECODE},
        "sglang": {"causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", sgl.PACKED_DECODE},
    }
    for backend, labels in want.items():
        plan = planner.plan(backend, "90", PlanOptions(ops=("gdn",)))
        assert set(plan.ops["gdn"].dispatch) == labels, backend
        version = load_pins(ROOT / "pins.yaml").pin(backend)[0]
        assert all(load_backend(backend).RUNNERS.find("gdn", d, version) for d in labels)
