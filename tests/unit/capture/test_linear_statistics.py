"""The LS statistics' products against numpy's float64 products of the same activations: the Gram
accumulated by row blocks up to the diagonal (:func:`add_gram`) and mirrored (:func:`symmetrize`),
the targets formed without float64 copies of the activations, the squared norm as one dot product.
Hidden sizes of 256 and more take the block path (:func:`gram_blocks`); the tiny models of the
capture tests do not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replaceme_exp.capture.statistics import BatchTokens, LinearStatistics, add_gram, gram_blocks, symmetrize
from replaceme_exp.capture.token_rules import TokenRule


def batches(n_batches: int, hidden: int, layers: int, dtype=torch.float32, seed: int = 0):
    """Random activations ``("L", k)`` and ``("M", k)`` of ``n_batches`` batches, with a few
    sink-like rows 30x the others' norm (what the massive-token rules pick)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(n_batches):
        n = 37 + 11 * b
        acts = {}
        for k in range(layers):
            for kind in ("L", "M"):
                act = torch.randn(n, hidden, generator=gen)
                act[::9] *= 30.0
                acts[(kind, k)] = act.to(dtype)
        ends = torch.tensor([n // 3, 2 * n // 3, n]) - 1
        positions = torch.cat([torch.arange(e - s) for s, e in zip([0, *(ends[:-1] + 1).tolist()], ends + 1)])
        out.append((acts, BatchTokens(n, ends, positions)))
    return out


def feed(stats, data):
    for acts, tokens in data:
        for _, update in stats.requests():
            update(acts, tokens)
    return stats.result()


def reference(data, cut, placement, rule):
    """M^T M, M^T R and ||R||^2 of one cut in numpy float64 from the kept (or scaled) rows."""
    start, end = cut
    mtm = mtr = 0.0
    r_sq = 0.0
    for acts, tokens in data:
        prev, after = acts[("L", start - 1)], acts[("L", end - 1)]
        mask = rule.keep(tokens, prev, after if rule.per_cut else None)
        rows = [a.double().numpy() for a in (prev, acts[("M", start - 1)], after)]
        if mask is not None and mask.dtype == torch.bool:
            rows = [a[mask.numpy()] for a in rows]
        elif mask is not None:
            rows = [a * mask.double().numpy()[:, None] for a in rows]
        p, m, a = rows
        x, r = (m, a - (p - m)) if placement == "fused" else (p, a)
        mtm, mtr, r_sq = mtm + x.T @ x, mtr + x.T @ r, r_sq + float((r * r).sum())
    return mtm, mtr, r_sq


@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 8])
def test_gram_by_blocks_is_the_full_product(blocks):
    gen = torch.Generator().manual_seed(blocks)
    total = torch.zeros(40, 40, dtype=torch.float64)
    xs = [torch.randn(n, 40, generator=gen, dtype=torch.float64) for n in (7, 30, 1)]
    for x in xs:
        add_gram(total, x, "float64", blocks)
    want = sum(x.numpy().T @ x.numpy() for x in xs)
    got = symmetrize(total).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(got, got.T)


def test_gram_blocks_keep_narrow_products_whole():
    assert [gram_blocks(d) for d in (32, 127, 128, 576, 2048, 4096, 8192)] == [1, 1, 1, 4, 16, 16, 16]


@pytest.mark.parametrize(
    "placement, rule",
    [
        ("fused", TokenRule()),
        ("separate", TokenRule()),
        ("fused", TokenRule("skip_first", first=2)),
        ("fused", TokenRule("skip_massive", massive_threshold=5.0)),
        ("fused", TokenRule("rescale_massive", massive_threshold=5.0)),
    ],
)
def test_statistics_match_numpy_float64(placement, rule):
    """Hidden 384: three row blocks; cuts (1, 3) and (1, 4) share a start, (2, 4) does not."""
    data = batches(3, 384, 4)
    cuts = [(1, 3), (1, 4), (2, 4)]
    got = feed(LinearStatistics(cuts, 384, torch.device("cpu"), placement, rule), data)
    for cut in cuts:
        mtm, mtr, r_sq = reference(data, cut, placement, rule)
        np.testing.assert_allclose(got[cut].mtm.numpy(), mtm, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(got[cut].mtr.numpy(), mtr, rtol=1e-12, atol=1e-9)
        assert got[cut].r_sq == pytest.approx(r_sq, rel=1e-12)
        assert torch.equal(got[cut].mtm, got[cut].mtm.T)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_statistics_of_other_activation_dtypes(dtype, precision):
    """bfloat16 activations (a bfloat16 model) enter exactly; float64 ones under float32 products
    are rounded to float32 first, as the products take them."""
    data = batches(2, 256, 3, dtype=dtype, seed=1)
    got = feed(LinearStatistics([(1, 3)], 256, torch.device("cpu"), precision=precision), data)[(1, 3)]
    if precision == "float32" and dtype == torch.float64:
        data = [({k: v.float() for k, v in acts.items()}, tokens) for acts, tokens in data]
    mtm, mtr, r_sq = reference(data, (1, 3), "fused", TokenRule())
    tol = 1e-12 if precision == "float64" else 1e-5
    np.testing.assert_allclose(got.mtm.numpy(), mtm, rtol=tol, atol=tol * np.abs(mtm).max())
    np.testing.assert_allclose(got.mtr.numpy(), mtr, rtol=tol, atol=tol * np.abs(mtr).max())
    assert got.r_sq == pytest.approx(r_sq, rel=1e-12 if precision == "float64" else 1e-6)
    assert got.mtm.dtype == got.mtr.dtype == torch.float64


def test_result_is_symmetric_again_after_more_batches():
    """result() mirrors the lower triangle; batches fed after it keep accumulating the lower one."""
    data = batches(3, 256, 3, seed=2)
    stats = LinearStatistics([(1, 3)], 256, torch.device("cpu"))
    feed(stats, data[:1])
    got = feed(stats, data[1:])[(1, 3)]
    mtm, _, _ = reference(data, (1, 3), "fused", TokenRule())
    np.testing.assert_allclose(got.mtm.numpy(), mtm, rtol=1e-12, atol=1e-9)
