"""Each validation bound pinned from both sides: the value AT the bound and the value one step past it.

One row per side of a bound; the id names the bound and the side. Expected outcomes come from the documented rule
(the docstring, the --help text or the error message that states the bound), so a bound moved by one step (`<` for
`<=`, a minimum of 0 for 1, a limit of N+1 for N, an upper bound dropped) fails a row.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import llama_config
from pydantic import ValidationError

from opcollect import flags
from opcollect.cases.grids import NK, CustomAllreduceGrid, HeadSweep, ModelHeads
from opcollect.cases.profiles import read_hf_config
from opcollect.cases.systems import DenseTflops
from opcollect.cases.vision import VisionConfig
from opcollect.cluster.scripts import SlurmOptions
from opcollect.errors import InputError
from opcollect.files import check_name, write_atomic
from opcollect.runtime.harness import TimingConfig, sample_until_stable
from opcollect.tables.noise import AMBIGUOUS, FASTER, SAME, SLOWER, Measured, Thresholds, classify
from opcollect.tables.values import measured_faults

OK = None  # the value is accepted
# the documented limits, stated here rather than imported, so a limit moved in the source fails a row
MAX_DIM = 2**40  # "an integer from 1 to 2**40" (runtime/planfile.py, every case and config size)
NAME_MAX = 255  # "give names of at most 255 bytes" (flags.py, ENAMETOOLONG)
PATH_MAX = 4096  # Linux's PATH_MAX, the terminating NUL included: a path holds at most 4095 bytes

# --- CLI flag types (flags.py): the text a flag takes, and whether it is refused ---------------------------------


@pytest.mark.parametrize(
    "parse, text, refused",
    [
        pytest.param(flags.shard, "0/1", False, id="shard-count-min-1-at"),
        pytest.param(flags.shard, "0/0", True, id="shard-count-min-1-past"),
        pytest.param(flags.shard, "0/2", False, id="shard-index-min-0-at"),
        pytest.param(flags.shard, "-1/2", True, id="shard-index-min-0-past"),
        pytest.param(flags.shard, "1/2", False, id="shard-index-below-count-at"),
        pytest.param(flags.shard, "2/2", True, id="shard-index-below-count-past"),
        pytest.param(flags.count, "1", False, id="count-above-0-at"),  # --min-samples: a whole number > 0
        pytest.param(flags.count, "0", True, id="count-above-0-past"),
        pytest.param(flags.seconds, "1e-9", False, id="seconds-above-0-at"),  # --max-case-seconds: > 0
        pytest.param(flags.seconds, "0", True, id="seconds-above-0-past"),
        pytest.param(flags.ratio, "0", False, id="ratio-at-least-0-at"),  # --max-noise: >= 0 (0 is a setting)
        pytest.param(flags.ratio, "-1e-9", True, id="ratio-at-least-0-past"),
    ],
)
def test_flag_bounds(parse, text, refused):
    if refused:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    else:
        parse(text)


# --- Slurm options (cluster/scripts.py): "give 1 to 1000 array tasks", "a whole number from LOW to HIGH" ------


@pytest.mark.parametrize(
    "field, value, flag",
    [
        pytest.param("shards", 1, OK, id="shards-min-1-at"),
        pytest.param("shards", 0, "--shards", id="shards-min-1-past"),
        pytest.param("shards", 1000, OK, id="shards-max-1000-at"),
        pytest.param("shards", 1001, "--shards", id="shards-max-1000-past"),
        pytest.param("gpus_per_task", 0, OK, id="gpus-per-task-min-0-at"),
        pytest.param("gpus_per_task", -1, "--gpus-per-task", id="gpus-per-task-min-0-past"),
        pytest.param("gpus_per_task", 64, OK, id="gpus-per-task-max-64-at"),
        pytest.param("gpus_per_task", 65, "--gpus-per-task", id="gpus-per-task-max-64-past"),
        pytest.param("cpus_per_task", 1, OK, id="cpus-per-task-min-1-at"),
        pytest.param("cpus_per_task", 0, "--cpus-per-task", id="cpus-per-task-min-1-past"),
        pytest.param("cpus_per_task", 1024, OK, id="cpus-per-task-max-1024-at"),
        pytest.param("cpus_per_task", 1025, "--cpus-per-task", id="cpus-per-task-max-1024-past"),
        pytest.param("partition", "p", OK, id="slurm-name-min-1-char-at"),
        pytest.param("partition", "", "--partition", id="slurm-name-min-1-char-past"),
        pytest.param("partition", "p" * 64, OK, id="slurm-name-max-64-chars-at"),
        pytest.param("partition", "p" * 65, "--partition", id="slurm-name-max-64-chars-past"),
    ],
)
def test_slurm_option_bounds(field, value, flag):
    if flag is None:
        assert getattr(SlurmOptions(**{"shards": 1, field: value}), field) == value
    else:
        with pytest.raises(InputError, match=flag):
            SlurmOptions(**{"shards": 1, field: value})


# --- case grids (cases/grids.py) and model configs (cases/profiles.py) ----------------------------------------

ALLREDUCE = {"dtypes": ["bfloat16"], "num_gpus": [2], "message_size": [1]}
SWEEP = {"num_heads": [8], "kv_heads": [0], "head_dim": [64]}
HEADS = {"model": "m", "num_heads": 8, "kv_heads": 8, "head_dim": 64, "tp_sizes": [1]}


@pytest.mark.parametrize(
    "model, values, accepted",
    [
        pytest.param(NK, {"n": 1, "k": 1}, True, id="grid-posint-above-0-at"),
        pytest.param(NK, {"n": 0, "k": 1}, False, id="grid-posint-above-0-past"),
        pytest.param(HeadSweep, SWEEP, True, id="grid-nonnegint-kv-heads-0-at"),  # 0: as many as num_heads
        pytest.param(HeadSweep, {**SWEEP, "kv_heads": [-1]}, False, id="grid-nonnegint-kv-heads-0-past"),
        pytest.param(CustomAllreduceGrid, ALLREDUCE, True, id="grid-gpu-count-min-2-at"),
        pytest.param(CustomAllreduceGrid, {**ALLREDUCE, "num_gpus": [1]}, False, id="grid-gpu-count-min-2-past"),
        pytest.param(CustomAllreduceGrid, {**ALLREDUCE, "message_size": []}, False, id="grid-list-min-length-1-past"),
        pytest.param(ModelHeads, HEADS, True, id="grid-kv-heads-at-most-num-heads-at"),  # MHA: kv = heads
        pytest.param(ModelHeads, {**HEADS, "kv_heads": 16}, False, id="grid-kv-heads-at-most-num-heads-past"),
    ],
)
def test_grid_bounds(model, values, accepted):
    if accepted:
        model.model_validate(values)
    else:
        with pytest.raises(ValidationError):
            model.model_validate(values)


@pytest.mark.parametrize(
    "config, field",
    [
        # intermediate_size: no other rule refuses 2**40 + 1 (an odd hidden_size is refused for its head_dim too)
        pytest.param({"intermediate_size": MAX_DIM}, OK, id="profile-size-max-dim-at"),
        pytest.param({"intermediate_size": MAX_DIM + 1}, "intermediate_size", id="profile-size-max-dim-past"),
        pytest.param({"num_key_value_heads": 8}, OK, id="profile-kv-heads-at-most-heads-at"),
        pytest.param({"num_key_value_heads": 16}, "num_key_value_heads", id="profile-kv-heads-at-most-heads-past"),
        pytest.param({"moe_layer_freq": 1}, OK, id="profile-moe-layer-freq-above-0-at"),
        pytest.param({"moe_layer_freq": 0}, "moe_layer_freq", id="profile-moe-layer-freq-above-0-past"),
        pytest.param({"moe_layer_freq": MAX_DIM}, OK, id="profile-moe-layer-freq-max-dim-at"),
        pytest.param({"moe_layer_freq": MAX_DIM + 1}, "moe_layer_freq", id="profile-moe-layer-freq-max-dim-past"),
        pytest.param({"first_k_dense_replace": 0}, OK, id="profile-nonnegint-min-0-at"),
        pytest.param({"first_k_dense_replace": -1}, "first_k_dense_replace", id="profile-nonnegint-min-0-past"),
        pytest.param({"first_k_dense_replace": MAX_DIM}, OK, id="profile-nonnegint-max-dim-at"),
        pytest.param({"first_k_dense_replace": MAX_DIM + 1}, "first_k_dense_replace",
                     id="profile-nonnegint-max-dim-past"),
        pytest.param({"num_local_experts": 8, "num_experts_per_tok": 1}, OK, id="profile-topk-min-1-at"),
        pytest.param({"num_local_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok",
                     id="profile-topk-min-1-past"),
    ],
)  # fmt: skip
def test_model_config_bounds(tmp_path, config, field):
    if field is None:
        llama_config(tmp_path, **config)
    else:
        with pytest.raises(InputError, match=field):
            llama_config(tmp_path, **config)


DATA = Path(__file__).parent / "data"
FLASH = DATA / "dsv4_configs" / "sgl-project--DeepSeek-V4-Flash-FP8_config.json"  # 43 layers, head_dim 512
GLM = DATA / "sparse_configs" / "zai-org--GLM-5.2-FP8_config.json"  # index_topk_freq 4, offset 3
QWEN35 = DATA / "linear_configs" / "Qwen--Qwen3.5-27B_config.json"  # Gated DeltaNet keys under text_config


def _text(**keys):
    """A change to the keys under text_config (a multimodal config.json keeps the language model's there)."""
    return lambda d: {"text_config": {**d["text_config"], **keys}}


@pytest.mark.parametrize(
    "source, change, field",
    [
        # DeepSeek-V4: one compress ratio per layer at least; the rotated part of a head below head_dim
        pytest.param(FLASH, lambda d: {"compress_ratios": d["compress_ratios"][:43]}, OK,
                     id="dsv4-compress-ratios-cover-layers-at"),
        pytest.param(FLASH, lambda d: {"compress_ratios": d["compress_ratios"][:42]}, "compress_ratios",
                     id="dsv4-compress-ratios-cover-layers-past"),
        pytest.param(FLASH, lambda d: {"qk_rope_head_dim": 511}, OK, id="dsv4-rope-below-head-dim-at"),
        pytest.param(FLASH, lambda d: {"qk_rope_head_dim": 512}, "qk_rope_head_dim",
                     id="dsv4-rope-below-head-dim-past"),
        # DSA: layer 0 cannot reuse a top-k when layers share them (index_topk_freq > 1); offset 1 or more
        pytest.param(GLM, lambda d: {"index_skip_topk_offset": 1}, OK, id="dsa-skip-offset-min-1-at"),
        pytest.param(GLM, lambda d: {"index_skip_topk_offset": 0}, "index_skip_topk_offset",
                     id="dsa-skip-offset-min-1-past"),
        pytest.param(GLM, lambda d: {"index_topk_freq": 1, "index_skip_topk_offset": 0}, OK,
                     id="dsa-topk-freq-above-1-needs-offset-at"),
        pytest.param(GLM, lambda d: {"index_topk_freq": 2, "index_skip_topk_offset": 0}, "index_skip_topk_offset",
                     id="dsa-topk-freq-above-1-needs-offset-past"),
        # each family module bounds its own keys by the plan file's 2**40 (and above 0)
        pytest.param(FLASH, lambda d: {"max_position_embeddings": MAX_DIM}, OK, id="dsv4-size-max-dim-at"),
        pytest.param(FLASH, lambda d: {"max_position_embeddings": MAX_DIM + 1}, "max_position_embeddings",
                     id="dsv4-size-max-dim-past"),
        pytest.param(FLASH, lambda d: {"hc_sinkhorn_iters": 1}, OK, id="dsv4-posint-above-0-at"),
        pytest.param(FLASH, lambda d: {"hc_sinkhorn_iters": 0}, "hc_sinkhorn_iters", id="dsv4-posint-above-0-past"),
        pytest.param(GLM, lambda d: {"max_position_embeddings": MAX_DIM}, OK, id="dsa-size-max-dim-at"),
        pytest.param(GLM, lambda d: {"max_position_embeddings": MAX_DIM + 1}, "max_position_embeddings",
                     id="dsa-size-max-dim-past"),
        pytest.param(GLM, lambda d: {"index_topk_freq": 0}, "index_topk_freq", id="dsa-posint-above-0-past"),
        pytest.param(QWEN35, _text(linear_conv_kernel_dim=MAX_DIM), OK, id="gdn-size-max-dim-at"),
        pytest.param(QWEN35, _text(linear_conv_kernel_dim=MAX_DIM + 1), "linear_conv_kernel_dim",
                     id="gdn-size-max-dim-past"),
        pytest.param(QWEN35, _text(linear_conv_kernel_dim=1), OK, id="gdn-posint-above-0-at"),
        pytest.param(QWEN35, _text(linear_conv_kernel_dim=0), "linear_conv_kernel_dim", id="gdn-posint-above-0-past"),
    ],
)  # fmt: skip
def test_family_config_bounds(tmp_path, source, change, field):
    data = json.loads(source.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, **change(data)}))
    if field is None:
        read_hf_config(path)
    else:
        with pytest.raises(InputError, match=field):
            read_hf_config(path)


@pytest.mark.parametrize(
    "hidden, accepted",
    [
        pytest.param(MAX_DIM, True, id="vision-size-max-dim-at"),
        pytest.param(MAX_DIM + 1, False, id="vision-size-max-dim-past"),
        pytest.param(1, True, id="vision-posint-above-0-at"),
        pytest.param(0, False, id="vision-posint-above-0-past"),
    ],
)
def test_vision_config_bounds(hidden, accepted):
    if accepted:
        VisionConfig(hidden_size=hidden, num_heads=1)
    else:
        with pytest.raises(ValidationError, match="hidden_size"):
            VisionConfig(hidden_size=hidden, num_heads=1)


@pytest.mark.parametrize(
    "rate, accepted",
    [
        pytest.param(5e-324, True, id="system-rate-above-0-at"),
        pytest.param(0.0, False, id="system-rate-above-0-past"),
    ],
)
def test_system_rate_bound(rate, accepted):
    if accepted:
        DenseTflops(bfloat16=rate)
    else:
        with pytest.raises(ValidationError):
            DenseTflops(bfloat16=rate)


# --- the stopping rule's time caps (runtime/harness.py): "spent >= cap", and 4x the cap ends any case ----------


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    "values, config, stops_at",
    [
        # warm-up takes the first value; noisy samples then reach the 0.5 s cap exactly at the 3rd (3 samples: its
        # minimum count), or pass 4 x 0.25 s exactly at the 2nd of 0.5 s
        pytest.param([1.0, 0.25, 0.125, 0.125] + [0.25, 0.125] * 10, TimingConfig(1e-4, 10, 0.5, 0.0), 3,
                     id="time-cap-reached-at"),
        pytest.param([1.0, 0.25, 0.125, 0.0625] + [0.0625, 0.25] * 10, TimingConfig(1e-4, 10, 0.5, 0.0), 4,
                     id="time-cap-not-reached-past"),
        pytest.param([0.5] * 10, TimingConfig(1e-4, 5, 0.25, 0.0), 2, id="hard-cap-4x-at"),
        pytest.param([0.5, 0.5, 0.4375, 0.5], TimingConfig(1e-4, 5, 0.25, 0.0), 3, id="hard-cap-4x-past"),
    ],
)  # fmt: skip
def test_stopping_rule_caps(values, config, stops_at):
    clock = _Clock()
    it = iter(values)

    def sample():
        value = next(it)
        clock.now += value
        return value

    assert len(sample_until_stable(sample, config, clock).samples) == stops_at


# --- the compare verdicts (tables/noise.py) ------------------------------------------------------------------


def _row(p25: float, p75: float, samples: int = 10) -> Measured:
    return Measured((p25 + p75) / 2, p25, p75, samples)


@pytest.mark.parametrize(
    "old, new, thresholds, verdict",
    [
        # a change needs a gap of at least min_gap (relative to the lower facing bound); 0.25 is exact in binary
        pytest.param(_row(0.875, 1.0), _row(1.25, 1.375), Thresholds(min_gap=0.25), SLOWER, id="min-gap-slower-at"),
        pytest.param(_row(0.875, 1.0), _row(1.2421875, 1.375), Thresholds(min_gap=0.25), AMBIGUOUS,
                     id="min-gap-slower-past"),
        pytest.param(_row(1.25, 1.375), _row(0.875, 1.0), Thresholds(min_gap=0.25), FASTER, id="min-gap-faster-at"),
        pytest.param(_row(1.2421875, 1.375), _row(0.875, 1.0), Thresholds(min_gap=0.25), AMBIGUOUS,
                     id="min-gap-faster-past"),
        # the default clear gap is nvbench's 0.5%
        pytest.param(_row(0.999, 1.0), _row(1.0051, 1.006), Thresholds(), SLOWER, id="min-gap-default-0.5pct-above"),
        pytest.param(_row(0.999, 1.0), _row(1.0049, 1.006), Thresholds(), AMBIGUOUS, id="min-gap-default-0.5pct-below"),
        # fewer than min_samples (10) on either row: ambiguous
        pytest.param(_row(1.0, 1.01, 10), _row(2.0, 2.01, 10), Thresholds(), SLOWER, id="min-samples-10-at"),
        pytest.param(_row(1.0, 1.01, 10), _row(2.0, 2.01, 9), Thresholds(), AMBIGUOUS, id="min-samples-10-past"),
        # a relative IQR above max_noise (25%) on either row: ambiguous; exactly 25% decides
        pytest.param(Measured(1.0, 0.875, 1.125, 10), Measured(2.0, 1.75, 2.25, 10), Thresholds(), SLOWER,
                     id="max-noise-25pct-at"),
        pytest.param(Measured(1.0, 0.87, 1.13, 10), Measured(2.0, 1.75, 2.25, 10), Thresholds(), AMBIGUOUS,
                     id="max-noise-25pct-past"),
        # overlapping: the same only when the medians differ by less than either IQR
        pytest.param(Measured(4.0, 3.5, 4.5, 10), Measured(4.9375, 4.4375, 5.4375, 10), Thresholds(), SAME,
                     id="same-shift-below-iqr-inside"),
        pytest.param(Measured(4.0, 3.5, 4.5, 10), Measured(5.0, 4.5, 5.5, 10), Thresholds(), AMBIGUOUS,
                     id="same-shift-below-iqr-at"),
        # below OLD's IQR (1.0) but not NEW's (0.5): "within both IQRs" fails
        pytest.param(Measured(4.0, 3.5, 4.5, 10), Measured(4.75, 4.5, 5.0, 10), Thresholds(), AMBIGUOUS,
                     id="same-shift-below-both-iqrs-past"),
        # rows without quartiles: NEW/OLD >= 1 + t is slower, <= 1 / (1 + t) faster
        pytest.param(Measured(4.0), Measured(5.0), Thresholds(tolerance=0.25), SLOWER, id="tolerance-slower-at"),
        pytest.param(Measured(4.0), Measured(4.96875), Thresholds(tolerance=0.25), SAME, id="tolerance-slower-past"),
        pytest.param(Measured(5.0), Measured(4.0), Thresholds(tolerance=0.25), FASTER, id="tolerance-faster-at"),
        pytest.param(Measured(5.0), Measured(4.03125), Thresholds(tolerance=0.25), SAME, id="tolerance-faster-past"),
    ],
)  # fmt: skip
def test_compare_thresholds(old, new, thresholds, verdict):
    assert classify(old, new, thresholds).verdict == verdict


# --- value admission (tables/values.py): 0 <= p25 <= latency <= p75, samples >= 1, noise >= 0 -----------------

ORDER = "0 <= p25 <= latency <= p75 broken"


@pytest.mark.parametrize(
    "stats, faults",
    [
        pytest.param({}, [], id="quartiles-all-equal-at"),
        pytest.param({"latency_p25": 0.0}, [], id="p25-at-least-0-at"),
        pytest.param({"latency_p25": -1e-9}, [ORDER], id="p25-at-least-0-past"),
        pytest.param({"latency_p25": 1.0 + 1e-9}, [ORDER], id="p25-at-most-latency-past"),
        pytest.param({"latency_p75": 1.0 - 1e-9}, [ORDER], id="latency-at-most-p75-past"),
        pytest.param({"samples": 1}, [], id="samples-at-least-1-at"),
        pytest.param({"samples": 0}, ["samples below 1"], id="samples-at-least-1-past"),
        pytest.param({"noise": 0.0}, [], id="noise-at-least-0-at"),
        pytest.param({"noise": -1e-9}, ["noise not finite and >= 0"], id="noise-at-least-0-past"),
        pytest.param({"latency": 5e-324, "latency_p25": 0.0, "latency_p75": 5e-324}, [], id="latency-above-0-at"),
        pytest.param({"latency": 0.0, "latency_p25": 0.0, "latency_p75": 0.0}, ["latency not finite and positive"],
                     id="latency-above-0-past"),
    ],
)  # fmt: skip
def test_measured_value_bounds(stats, faults):
    row = {"latency": 1.0, "latency_p25": 1.0, "latency_p75": 1.0, "samples": 10, "noise": 0.0, **stats}
    table = pa.table({**{k: pa.array([v], pa.float64()) for k, v in row.items() if k != "samples"},
                      "samples": pa.array([row["samples"]], pa.int64()), "timing": ["cpu"]})  # fmt: skip
    assert [f.what for f in measured_faults(table)] == faults


# --- name limits (files.py): one name of at most NAME_MAX (255) bytes, a path under PATH_MAX (4096) bytes -------


@pytest.mark.parametrize(
    "name, refused",
    [
        pytest.param("n" * NAME_MAX, False, id="name-max-255-bytes-at"),
        pytest.param("n" * (NAME_MAX + 1), True, id="name-max-255-bytes-past"),
        pytest.param("\u00e9" * 127 + "n", False, id="name-max-255-bytes-utf8-at"),  # 127 x 2 + 1 bytes
        pytest.param("\u00e9" * 128, True, id="name-max-255-bytes-utf8-past"),
    ],
)
def test_name_limit(tmp_path, name, refused):
    target = tmp_path / name
    if refused:  # by check_name itself, before anything is written (the file system would refuse it later)
        with pytest.raises(OSError) as caught:
            check_name(target)
        assert caught.value.errno == errno.ENAMETOOLONG
        with pytest.raises(OSError) as caught:
            write_atomic(target, "{}")
        assert caught.value.errno == errno.ENAMETOOLONG and caught.value.filename == str(target)
        assert list(tmp_path.iterdir()) == []
    else:  # the temporary file beside it fits NAME_MAX too
        write_atomic(target, "{}")
        assert os.listdir(tmp_path) == [name]


def _path_of(length: int) -> str:
    """An absolute path of ``length`` bytes whose names are each at most NAME_MAX bytes."""
    parts, left = [], length - 1
    while left > 0:
        part = min(NAME_MAX, left)
        if left - part == 1:  # never leave room for only the separator
            part -= 1
        parts.append("p" * part)
        left -= part + 1
    path = "/" + "/".join(parts)
    assert len(path) == length
    return path


@pytest.mark.parametrize(
    "length, refused",
    [
        pytest.param(PATH_MAX - 1, False, id="path-below-4096-bytes-at"),
        pytest.param(PATH_MAX, True, id="path-below-4096-bytes-past"),
    ],
)
def test_path_limit(length, refused):
    if refused:
        with pytest.raises(OSError) as caught:
            check_name(_path_of(length))
        assert caught.value.errno == errno.ENAMETOOLONG
    else:
        check_name(_path_of(length))
