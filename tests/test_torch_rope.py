"""The rotary embeddings the torch runners apply are the models': DeepSeek-V4 turns the last 64 dims of a head
(qk_rope_head_dim) in interleaved pairs at base 10000, and the DSA runner's tables default to base 10000. A rope
over the wrong dims or base costs about the same, so no timing shows it; these values do."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from opcollect.backends.torch import dsa, dsv4  # noqa: E402


def test_dsv4_rope_turns_the_last_64_dims_in_pairs_at_base_10000():
    cos, sin = dsv4.rope_tables(torch.tensor([0, 1, 5]))
    assert tuple(cos.shape) == tuple(sin.shape) == (3, 32)
    for i in (0, 1, 31):
        angle = 5 * 10000 ** (-2 * i / 64)
        assert cos[2, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
        assert sin[2, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    turned = dsv4.rotate(x, cos, sin)
    assert torch.equal(turned[:, :448], x[:, :448])  # the nope dims stay
    assert torch.equal(turned[0], x[0])  # position 0 turns nothing
    pair = x[1, 448:450]  # the first pair at position 1 turns by 1 radian
    expected = torch.stack(
        (pair[0] * math.cos(1) - pair[1] * math.sin(1), pair[1] * math.cos(1) + pair[0] * math.sin(1))
    )
    assert torch.allclose(turned[1, 448:450], expected, atol=1e-5)
    assert torch.allclose(dsv4.rotate(turned, cos, sin, inverse=True), x, atol=1e-5)


def test_dsa_rope_tables_default_to_base_10000():
    cos, sin = dsa.rope_tables(torch.tensor([3]), 64)
    assert tuple(cos.shape) == (1, 32)
    assert cos[0, 1].item() == pytest.approx(math.cos(3 * 10000 ** (-2 / 64)), abs=1e-6)
    assert sin[0, 31].item() == pytest.approx(math.sin(3 * 10000 ** (-62 / 64)), abs=1e-6)
