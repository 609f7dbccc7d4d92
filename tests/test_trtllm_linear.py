"""TensorRT-LLM's Gated DeltaNet and Mamba2 runners (backends/trtllm/linear_attention.py, linear_inputs.py) against a
stand-in tensorrt_llm up to the kernel call: stand-in layers (Qwen3NextGatedDeltaNet, Mamba2Mixer) and kernels record
what the runner builds and hands them. Checked: each row's call is the layer's (the kernel, the pools in the cache
manager's layout, the slots of the input set), the prefill form follows the installed forward_extend's source, the
label is the reference's, the refusals come before any import, the source assumptions are read from the installed
package, and TensorRT-LLM's gdn and mamba2 are planned with every case passing the builders."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cases_of, install_fakes

from opcollect.backends.trtllm import linear_attention as runner
from opcollect.backends.trtllm import linear_inputs as inputs
from opcollect.backends.trtllm import torch_ops
from opcollect.plans.linear_attention import TRTLLM_GDN, TRTLLM_MAMBA2, GdnCase, Mamba2Case
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

TREE = Path(__file__).parent / "data" / "trtllm-release"
# the calls the copies read make (gdn_mixer.py @0d4bd901, mamba2_mixer.py @02140fd4), reduced to what the
# assumptions and state_form read
GDN_SOURCE = """
class Qwen3NextGatedDeltaNet:
    def forward_extend(self):
        causal_conv1d_fn(x, w, b, cache_indices=cache_indices, query_start_loc=q)
        chunk_gated_delta_rule(q=q, initial_state_indices=cache_indices, {indexed}cu_seqlens=c, head_first=False,
                               use_qk_l2norm_in_kernel={l2})
    def forward_decode(self):
        causal_conv1d_update(x, s, w, b, conv_state_indices=i)
        fused_sigmoid_gating_delta_rule_update(initial_state_indices=cache_indices, cu_seqlens=c)
"""
MAMBA2_SOURCE = """
class Mamba2Mixer:
    def forward(self):
        causal_conv1d_fn(x)
        mamba_chunk_scan_combined(x, return_varlen_states=True)
        causal_conv1d_update(x)
        self.selective_state_update_func(s, state_batch_indices=i)
"""


def gdn(stage="core", phase="context", b=2, s=5, nk=2, hk=8, nv=4, hv=8):
    s = 1 if phase == "generation" else s
    return GdnCase(stage, phase, b, s, b * s, 1024, 4, nk, hk, nv, hv, "m")


def mamba2(stage="core", phase="context", b=2, s=5, h=4, p=8, g=2, n=16):
    s = 1 if phase == "generation" else s
    return Mamba2Case(stage, phase, b, s, b * s, 1024, n, 4, h, p, g, 8, "m")


def installed(tmp_path, monkeypatch, indexed=True, normalized=True) -> Path:
    root = tmp_path / "tensorrt_llm"
    (root / "_torch/modules/mamba").mkdir(parents=True)
    source = GDN_SOURCE.format(indexed="inplace_indexed_state_update=True, " if indexed else "", l2=not normalized)
    (root / "_torch/modules/mamba/gdn_mixer.py").write_text(source)
    (root / "_torch/modules/mamba/mamba2_mixer.py").write_text(MAMBA2_SOURCE)
    monkeypatch.setattr(torch_ops, "installed_root", lambda: root)
    torch_ops._installed_problems.cache_clear()
    runner.state_form.cache_clear()
    return root


class Fakes:
    """The stand-in tensorrt_llm: layers built as TensorRT-LLM builds them (parameters and dtypes), kernels that
    record their arguments."""

    def __init__(self, post_conv=True):
        self.calls: list = []
        self.layers: list = []
        self.post_conv = post_conv

    def record(self, name):
        def kernel(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return args[0] if args else None

        return kernel

    def install(self, monkeypatch) -> None:
        fake = self

        class Conv:
            def __init__(self, d_conv, channels, bias):
                self.shape, self.with_bias = (channels, d_conv), bias
                self.weight = self.bias = None

            def create_weights(self):
                self.weight = torch.empty(self.shape, dtype=torch.bfloat16)
                self.bias = torch.empty(self.shape[0], dtype=torch.bfloat16) if self.with_bias else None

        class Qwen3NextGatedDeltaNet:
            def __init__(self, model_config, aux_stream, layer_idx=None):
                c = model_config.pretrained_config
                self.config, self.activation = model_config, c.hidden_act
                nk, hk, nv, hv = (
                    c.linear_num_key_heads,
                    c.linear_key_head_dim,
                    c.linear_num_value_heads,
                    c.linear_value_head_dim,
                )
                self.conv1d = Conv(c.linear_conv_kernel_dim, 2 * nk * hk + nv * hv, False)
                self.A_log, self.dt_bias = torch.zeros(nv), torch.ones(nv)
                fake.layers.append(self)

            def to(self, device):
                return self

        class Mamba2Mixer:
            def __init__(self, *, d_model, d_state, d_conv, nheads, n_groups, head_dim, chunk_size, layer_idx, **kw):
                self.kw, self.chunk_size, self.delta_softplus = kw, chunk_size, True
                self.conv1d = Conv(d_conv, nheads * head_dim + 2 * n_groups * d_state, kw.get("conv_bias", True))
                self.A, self.D, self.dt_bias = torch.empty(nheads), torch.empty(nheads), torch.empty(nheads)
                self._mamba_ssm_cache_dtype = None
                self.head_dim, self.d_state = head_dim, d_state
                self.selective_state_update_func = fake.record("selective_state_update_func")
                fake.layers.append(self)

            def to(self, device):
                return self

            def post_load_weights(self):
                self._A_expanded = self.A[:, None, None].expand(-1, self.head_dim, self.d_state).float()
                self._D_expanded = self.D[:, None].expand(-1, self.head_dim)
                self._dt_bias_expanded = self.dt_bias[:, None].expand(-1, self.head_dim)

        def post_conv(mixed_t, mixed_d, a, b, A_log, dt_bias, nk, hk, nv, hv):
            t = mixed_t.shape[1]
            fake.calls.append(("fused_gdn_post_conv", (mixed_t, a, b), {}))
            return (torch.zeros(1, t, nk, hk), torch.zeros(1, t, nk, hk), torch.zeros(1, t, nv, hv),
                    torch.zeros(1, t, nv), torch.zeros(1, t, nv))  # fmt: skip

        def gating(A_log, a, dt_bias):
            return torch.zeros(a.shape, dtype=torch.float32)

        def scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 chunk_indices=None, chunk_offsets=None, cu_seqlens=None, dt_softplus=False, dt_limit=None,
                 return_final_states=False, return_varlen_states=False, out=None, state_dtype=None):  # fmt: skip
            fake.calls.append(("mamba_chunk_scan_combined", (x, dt, A, B, C), dict(locals())))

        kernels = {
            "causal_conv1d_fn": self.record("causal_conv1d_fn"),
            "causal_conv1d_update": self.record("causal_conv1d_update"),
        }
        gdn = {
            **kernels,
            "Qwen3NextGatedDeltaNet": Qwen3NextGatedDeltaNet,
            "chunk_gated_delta_rule": self.record("chunk_gated_delta_rule"),
            "fused_sigmoid_gating_delta_rule_update": self.record("fused_sigmoid_gating_delta_rule_update"),
            "fused_gdn_gating": gating,
        }
        if self.post_conv:
            gdn["fused_gdn_post_conv"] = post_conv
        install_fakes(
            monkeypatch,
            {
                "tensorrt_llm._torch.model_config": {"ModelConfig": lambda **kw: SimpleNamespace(**kw)},
                "tensorrt_llm.mapping": {"Mapping": lambda **kw: SimpleNamespace(**kw)},
                "tensorrt_llm._torch.modules.mamba.gdn_mixer": gdn,
                "tensorrt_llm._torch.modules.mamba.mamba2_mixer": {
                    **kernels,
                    "Mamba2Mixer": Mamba2Mixer,
                    "mamba_chunk_scan_combined": scan,
                },
            },
        )
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: None)


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch)
    fake = Fakes()
    fake.install(monkeypatch)
    return fake


def run(prepare, case, copies=2, times=3):
    prepared = prepare(case, "x", "cpu", copies)
    for _ in range(times):
        prepared.call()
    return prepared


def test_labels_are_the_plans_dispatch_for_trtllm():
    assert {k: inputs.LABELS["gdn"][k] for k in TRTLLM_GDN} == TRTLLM_GDN
    assert {k: inputs.LABELS["mamba2"][k] for k in TRTLLM_MAMBA2} == TRTLLM_MAMBA2


def test_gdn_layer_and_pools_are_the_rank_layer_and_the_cache_layout(fakes):
    c = gdn("conv", "context")
    prepared = run(runner.prepare_gdn, c)
    assert prepared.kernel_source == "causal_conv1d_fn"
    [layer] = fakes.layers
    keys = vars(layer.config.pretrained_config)
    assert keys["linear_num_key_heads"] == 2 and keys["linear_num_value_heads"] == 4 and keys["hidden_size"] == 1024
    assert layer.config.mapping.tp_size == 1 and layer.config.skip_create_weights_in_init
    calls = [k for k in fakes.calls if k[0] == "causal_conv1d_fn"]
    assert len(calls) == 3
    x, weight, bias = calls[0][1]
    kw = calls[0][2]
    channels = 2 * 2 * 8 + 4 * 8
    assert x.shape == (channels, 10) and weight.shape == (channels, 4) and bias is None
    assert kw["conv_states"].shape == (4, channels, 3) and kw["conv_states"].dtype == torch.bfloat16  # 2 copies x b
    assert kw["query_start_loc"].tolist() == [0, 5, 10] and not kw["has_initial_state"].any()
    # the input sets rotate with their own slots
    assert [k[2]["cache_indices"].tolist() for k in calls] == [[2, 3], [0, 1], [2, 3]]


def test_gdn_prefill_scan_takes_the_pool_by_index_and_normalized_qk(fakes):
    prepared = run(runner.prepare_gdn, gdn())
    assert prepared.kernel_source == "chunk_gated_delta_rule"
    [(_, args, kw)] = [k for k in fakes.calls if k[0] == "chunk_gated_delta_rule"][:1]
    assert not args and kw["initial_state"].shape == (4, 4, 8, 8) and kw["initial_state"].dtype == torch.bfloat16
    assert kw["inplace_indexed_state_update"] and not kw["output_final_state"]
    assert kw["use_qk_l2norm_in_kernel"] is False and kw["head_first"] is False
    assert kw["cu_seqlens"].dtype == torch.int64 and kw["cu_seqlens"].tolist() == [0, 5, 10]
    post = [k for k in fakes.calls if k[0] == "fused_gdn_post_conv"]
    assert len(post) == 2 and post[0][1][0].shape == (64, 10)  # one per input set, before anything is timed


def test_gdn_prefill_without_indexed_state_gathers_and_returns_the_final_state(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, indexed=False, normalized=False)
    fake = Fakes(post_conv=False)
    fake.install(monkeypatch)
    run(runner.prepare_gdn, gdn())
    kw = [k for k in fake.calls if k[0] == "chunk_gated_delta_rule"][0][2]
    assert kw["output_final_state"] and "initial_state_indices" not in kw
    assert kw["initial_state"].shape == (2, 4, 8, 8) and kw["use_qk_l2norm_in_kernel"] is True
    assert kw["q"].shape == (1, 10, 2, 8) and kw["v"].shape == (1, 10, 4, 8) and kw["g"].dtype == torch.float32


def test_gdn_decode_is_the_fused_gating_step_on_the_indexed_pool(fakes):
    prepared = run(runner.prepare_gdn, gdn("core", "generation", b=3))
    assert prepared.kernel_source == "fused_recurrent_gated_delta_rule"
    kw = [k for k in fakes.calls if k[0] == "fused_sigmoid_gating_delta_rule_update"][0][2]
    assert kw["q"].shape == (1, 3, 2, 8) and kw["v"].shape == (1, 3, 4, 8) and kw["a"].shape == (3, 4)
    assert kw["initial_state_source"].shape == (6, 4, 8, 8) and kw["initial_state_indices"].tolist() == [3, 4, 5]
    assert kw["use_qk_l2norm_in_kernel"] is True and kw["cu_seqlens"].tolist() == [0, 1, 2, 3]
    conv = run(runner.prepare_gdn, gdn("conv", "generation", b=3))
    assert conv.kernel_source == "causal_conv1d_update"
    args, kw = [k for k in fakes.calls if k[0] == "causal_conv1d_update"][0][1:]
    assert args[0].shape == (3, 64) and args[1].shape == (6, 64, 3) and args[4] == "silu"
    assert kw["conv_state_indices"].tolist() == [3, 4, 5]


def test_mamba2_scan_is_the_varlen_call_of_the_mixer(fakes):
    prepared = run(runner.prepare_mamba2, mamba2())
    assert prepared.kernel_source == "mamba_chunk_scan_combined"
    [layer] = fakes.layers
    assert layer.kw["dtype"] == torch.bfloat16 and layer.conv1d.bias is not None
    assert (layer.A < 0).all()
    (x, dt, a, bmat, cmat), kw = [k for k in fakes.calls if k[0] == "mamba_chunk_scan_combined"][0][1:]
    assert x.shape == (1, 10, 4, 8) and dt.shape == (1, 10, 4) and bmat.shape == (1, 10, 2, 16)
    assert kw["cu_seqlens"].tolist() == [0, 5, 10] and kw["seq_idx"].tolist() == [[0] * 5 + [1] * 5]
    assert kw["return_varlen_states"] and not kw["return_final_states"] and kw["initial_states"] is None
    assert kw["chunk_size"] == 8 and kw["out"].shape == x.shape and kw["dt_softplus"]


def test_mamba2_decode_is_the_mixers_state_update(fakes):
    prepared = run(runner.prepare_mamba2, mamba2("core", "generation", b=3))
    assert prepared.kernel_source == "selective_state_update"
    args, kw = [k for k in fakes.calls if k[0] == "selective_state_update_func"][0][1:]
    state, x, dt, a = args[:4]
    assert state.shape == (6, 4, 8, 16) and x.shape == (3, 4, 8) and dt.shape == (3, 4, 8) and dt.dtype == torch.float32
    assert a.shape == (4, 8, 16) and kw["state_batch_indices"].tolist() == [3, 4, 5] and kw["z"] is None
    conv = run(runner.prepare_mamba2, mamba2("conv", "context"))
    kw = [k for k in fakes.calls if k[0] == "causal_conv1d_fn"][0][2]
    assert conv.kernel_source == "causal_conv1d_fn" and kw["conv_states"].shape == (4, 4 * 8 + 2 * 2 * 16, 3)


@pytest.mark.parametrize(
    "op, case, why",
    [
        ("gdn", gdn(nv=3), "no multiple"),
        ("gdn", gdn()._replace(d_conv=1), "d_conv"),
        ("gdn", gdn()._replace(num_tokens=7), "num_tokens"),
        ("mamba2", mamba2(h=3), "groups"),
        ("gdn", gdn()._replace(stage="gate"), "no kernel"),
    ],
)
def test_refusals_come_before_any_import(op, case, why):
    prepare = runner.prepare_gdn if op == "gdn" else runner.prepare_mamba2
    with pytest.raises(KernelLimit, match=why):
        prepare(case, "x", "cpu", 1)
    with pytest.raises(KernelLimit, match=why):
        inputs.footprint(op, case)


def test_an_install_whose_layer_no_longer_makes_the_calls_is_refused(tmp_path, monkeypatch):
    root = installed(tmp_path, monkeypatch)
    assert torch_ops.problems(root, "gdn") == [] and torch_ops.problems(root, "mamba2") == []
    path = root / "_torch/modules/mamba/mamba2_mixer.py"
    path.write_text(MAMBA2_SOURCE.replace("self.selective_state_update_func(", "selective_state_update("))
    [line] = torch_ops.problems(root, "mamba2")
    assert "mamba2_mixer.py" in line and "selective_state_update_func" in line
    torch_ops._installed_problems.cache_clear()
    with pytest.raises(KernelLimit, match="no longer times what serving runs"):
        runner.prepare_mamba2(mamba2(), "x", "cpu", 1)


def test_footprint_grows_with_the_batch_and_holds_the_states():
    small, large = gdn(b=2, s=64), gdn(b=4, s=64)
    assert 0 < inputs.footprint("gdn", small) < inputs.footprint("gdn", large)
    d = gdn("core", "generation", b=8)
    assert inputs.footprint("gdn", d) >= 8 * 4 * 8 * 8 * 2
    m = mamba2("core", "generation", b=8)
    assert inputs.footprint("mamba2", m) >= 8 * 4 * 8 * 16 * 2


@pytest.mark.parametrize("op", ["gdn", "mamba2"])
def test_trtllms_linear_ops_are_planned_and_every_case_passes_the_builders(planner, op):
    plan = planner.plan("trtllm", "90", PlanOptions(ops=(op,)))
    selection = plan.ops[op]
    assert selection.values
    labels = set(selection.dispatch)
    assert labels == set(inputs.LABELS[op].values())
    for c in cases_of(selection):
        inputs.check_case(op, c)
        assert inputs.footprint(op, c) > 0
