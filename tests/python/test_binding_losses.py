"""Losses against PyTorch (Debian's python3-torch): loom.nn.functional's cross_entropy (class
indices and probabilities; reductions none/sum/mean; ignore_index inside and outside the class
range; label smoothing; class weights; logits (C,), (N, C) and (N, C, d1, d2)), nll_loss,
log_softmax, mse_loss, l1_loss, smooth_l1_loss and binary_cross_entropy_with_logits (weight,
pos_weight), and the loss modules. Each case feeds the same random float32 values to both
libraries and compares the loss and the gradient of every input.

Tolerances: both compute in float32 with different summation orders and exp/log libraries, so
values agree to a few ulps of the loss's scale: rtol 1e-5 / atol 1e-6 for values and gradients.
"""

import numpy as np
import pytest

import loom
import loom.nn as nn
import loom.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
rng = np.random.default_rng(1913)

import torch_twins  # noqa: E402  (imports torch: after the skip)
from torch_twins import pair  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6


def index_pair(a):
    a = np.array(a, dtype=np.int64, order="C")
    return loom.tensor(a), torch.tensor(a)


def check(loom_out, torch_out, leaves, rtol=RTOL, atol=ATOL):
    torch_twins.check(loom_out, torch_out, leaves, rng, rtol, atol)


def targets_for(shape, classes, ignore_index=None, ignored=0.3):
    """Random class indices, a fraction ``ignored`` of them ignore_index, but never all (a mean
    over nothing is a documented difference, tested alone)."""
    t = rng.integers(0, classes, size=shape)
    if ignore_index is not None:
        t = np.where(rng.random(size=shape) < ignored, ignore_index, t)
        t.flat[0] = (ignore_index + 1) % classes
    return t


# ---------------------------------------------------------------- cross_entropy

LOGIT_SHAPES = {"2d": (6, 5), "nd": (3, 4, 2, 3), "unbatched": (7,)}


def target_shape(logits_shape):
    if len(logits_shape) == 1:
        return ()
    return (logits_shape[0],) + tuple(logits_shape[2:])


@pytest.mark.parametrize("shape", list(LOGIT_SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_matches_torch(shape, reduction, smoothing, weighted):
    logits_shape = LOGIT_SHAPES[shape]
    classes = logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]
    ignore = -100 if shape != "unbatched" else None  # a lone target is never ignored here
    lx, tx = pair(rng.standard_normal(logits_shape) * 2)
    lt, tt = index_pair(targets_for(target_shape(logits_shape), classes, ignore))
    kwargs = dict(reduction=reduction, label_smoothing=smoothing)
    lw = tw = None
    if weighted:
        lw, tw = pair(rng.random(classes) + 0.5, requires_grad=False)
    check(F.cross_entropy(lx, lt, weight=lw, **kwargs),
          TF.cross_entropy(tx, tt, weight=tw, **kwargs), [(lx, tx)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_ignore_index_inside_the_class_range(reduction, smoothing):
    # Padding id 0 is a real class column: ignored targets must drop out even though the one-hot
    # selects that column.
    lx, tx = pair(rng.standard_normal((8, 4)))
    lt, tt = index_pair(targets_for((8,), 4, ignore_index=0, ignored=0.4))
    kwargs = dict(ignore_index=0, reduction=reduction, label_smoothing=smoothing)
    check(F.cross_entropy(lx, lt, **kwargs), TF.cross_entropy(tx, tt, **kwargs), [(lx, tx)])


def test_cross_entropy_plain_mean_uses_the_fused_kernel_for_any_rank():
    # (N, C, d1, d2) logits with ignored targets, no weight or smoothing: the fused C++ loss
    # (its autograd node is named cross_entropy), equal to torch's.
    lx, tx = pair(rng.standard_normal((2, 5, 3, 4)))
    lt, tt = index_pair(targets_for((2, 3, 4), 5, ignore_index=-100))
    out = F.cross_entropy(lx, lt)
    assert "grad_fn=<cross_entropy>" in repr(out)
    check(out, TF.cross_entropy(tx, tt), [(lx, tx)])


def test_cross_entropy_int32_targets_and_large_logits():
    logits = rng.standard_normal((5, 6)) * 40  # log_softmax must stay finite and exact
    lx, tx = pair(logits)
    t = rng.integers(0, 6, size=5)
    lt = loom.tensor(t.astype(np.int32))
    tt = torch.tensor(t)
    check(F.cross_entropy(lx, lt, reduction="none", label_smoothing=0.05),
          TF.cross_entropy(tx, tt, reduction="none", label_smoothing=0.05), [(lx, tx)],
          rtol=1e-5, atol=1e-5)  # atol: values of ~100 computed through exp/log in float32


@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3), (5,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_probabilities(shape, reduction):
    lx, tx = pair(rng.standard_normal(shape))
    probs = rng.random(shape)
    probs = probs / probs.sum(axis=0 if len(shape) == 1 else 1, keepdims=True)
    lp, tp = pair(probs, requires_grad=False)
    classes = shape[0] if len(shape) == 1 else shape[1]
    lw, tw = pair(rng.random(classes) + 0.5, requires_grad=False)
    kwargs = dict(reduction=reduction, label_smoothing=0.15)
    check(F.cross_entropy(lx, lp, weight=lw, **kwargs),
          TF.cross_entropy(tx, tp, weight=tw, **kwargs), [(lx, tx)])


def test_cross_entropy_all_targets_ignored_is_zero_not_nan():
    # A documented difference: PyTorch's mean over nothing is 0/0 = NaN; loom's is 0 with zero
    # gradients on both paths (fused and composed).
    for kwargs in ({}, {"label_smoothing": 0.1}, {"weight": loom.ones(3)}):
        x = loom.tensor(rng.standard_normal((2, 3)).astype(np.float32), requires_grad=True)
        loss = F.cross_entropy(x, loom.tensor([-100, -100]), **kwargs)
        assert float(loss) == 0.0
        loss.backward()
        np.testing.assert_array_equal(x.grad.numpy(), 0.0)
    assert np.isnan(TF.cross_entropy(torch.zeros(2, 3), torch.tensor([-100, -100])).item())


def test_cross_entropy_bad_targets_are_clear_errors():
    x = loom.zeros(3, 4)
    with pytest.raises(ValueError, match=r"target 4 is outside \[0, 4\)"):
        F.cross_entropy(x, loom.tensor([0, 4, 1]), label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"target 7 .*is outside \[0, 4\)"):
        F.cross_entropy(x, loom.tensor([0, 7, 1]))  # the fused kernel's check
    with pytest.raises(ValueError, match=r"target has shape \[2\], expected \[3\]"):
        F.cross_entropy(x, loom.tensor([0, 1]))
    with pytest.raises(ValueError, match="class probabilities"):
        F.cross_entropy(x, loom.zeros(3))
    with pytest.raises(ValueError, match="reduction must be"):
        F.cross_entropy(x, loom.tensor([0, 1, 2]), reduction="average")
    with pytest.raises(ValueError, match=r"weight has shape \[3\], expected \[4\]"):
        F.cross_entropy(x, loom.tensor([0, 1, 2]), weight=loom.ones(3))


def test_legacy_size_average_and_reduce_flags():
    lx, tx = pair(rng.standard_normal((4, 3)))
    lt, tt = index_pair([0, 2, 1, 1])
    with pytest.warns(UserWarning):
        out = F.cross_entropy(lx, lt, size_average=False)
    np.testing.assert_allclose(out.item(), TF.cross_entropy(tx, tt, reduction="sum").item(),
                               rtol=RTOL)


# ---------------------------------------------------------------- nll_loss, log_softmax

@pytest.mark.parametrize("shape", list(LOGIT_SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_of_log_softmax_matches_torch(shape, reduction, weighted):
    logits_shape = LOGIT_SHAPES[shape]
    classes = logits_shape[0] if len(logits_shape) == 1 else logits_shape[1]
    class_dim = 0 if len(logits_shape) == 1 else 1
    lx, tx = pair(rng.standard_normal(logits_shape))
    ignore = -100 if shape == "unbatched" else 2  # a lone target is never ignored here
    lt, tt = index_pair(targets_for(target_shape(logits_shape), classes,
                                    None if shape == "unbatched" else ignore))
    lw, tw = pair(rng.random(classes) + 0.5, requires_grad=False) if weighted else (None, None)
    kwargs = dict(reduction=reduction, ignore_index=ignore)
    check(F.nll_loss(F.log_softmax(lx, dim=class_dim), lt, weight=lw, **kwargs),
          TF.nll_loss(TF.log_softmax(tx, dim=class_dim), tt, weight=tw, **kwargs), [(lx, tx)])


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_log_softmax_matches_torch_along_any_dim(dim):
    lx, tx = pair(rng.standard_normal((3, 4, 5)) * 30)  # spread: tiny probabilities
    check(F.log_softmax(lx, dim=dim), TF.log_softmax(tx, dim=dim), [(lx, tx)], atol=1e-5)


# ---------------------------------------------------------------- regression losses

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", ["mse", "l1", "smooth_l1", "smooth_l1_beta0"])
def test_regression_losses_match_torch(name, reduction):
    lx, tx = pair(rng.standard_normal((4, 6)))
    ly, ty = pair(rng.standard_normal((4, 6)))
    loom_fn, torch_fn, extra = {
        "mse": (F.mse_loss, TF.mse_loss, {}),
        "l1": (F.l1_loss, TF.l1_loss, {}),
        "smooth_l1": (F.smooth_l1_loss, TF.smooth_l1_loss, {"beta": 0.7}),
        "smooth_l1_beta0": (F.smooth_l1_loss, TF.smooth_l1_loss, {"beta": 0.0}),
    }[name]
    check(loom_fn(lx, ly, reduction=reduction, **extra),
          torch_fn(tx, ty, reduction=reduction, **extra), [(lx, tx), (ly, ty)])


# ---------------------------------------------------------------- binary_cross_entropy_with_logits

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weights", ["none", "weight", "pos_weight", "both"])
def test_bce_with_logits_matches_torch(reduction, weights):
    lx, tx = pair(rng.standard_normal((5, 3)) * 6)  # large |x|: the stable form matters
    ly, ty = pair(rng.random((5, 3)))
    lw = tw = lp = tp = None
    if weights in ("weight", "both"):
        lw, tw = pair(rng.random((5, 1)) + 0.5, requires_grad=False)  # broadcast over classes
    if weights in ("pos_weight", "both"):
        lp, tp = pair(rng.random(3) * 3, requires_grad=False)
    check(F.binary_cross_entropy_with_logits(lx, ly, weight=lw, reduction=reduction,
                                             pos_weight=lp),
          TF.binary_cross_entropy_with_logits(tx, ty, weight=tw, reduction=reduction,
                                              pos_weight=tp),
          [(lx, tx), (ly, ty)])


def test_bce_with_logits_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"target has shape \[3\], expected the input's \[2, 3\]"):
        F.binary_cross_entropy_with_logits(loom.zeros(2, 3), loom.zeros(3))


# ---------------------------------------------------------------- modules

def test_loss_modules_match_torch_and_keep_weights_as_buffers():
    classes = 5
    lw, tw = pair(rng.random(classes) + 0.5, requires_grad=False)
    ours = nn.CrossEntropyLoss(weight=lw, ignore_index=1, label_smoothing=0.1, reduction="sum")
    theirs = torch.nn.CrossEntropyLoss(weight=tw, ignore_index=1, label_smoothing=0.1,
                                       reduction="sum")
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert [n for n, _ in ours.named_buffers()] == ["weight"]
    assert list(ours.parameters()) == []
    lx, tx = pair(rng.standard_normal((6, classes)))
    lt, tt = index_pair(targets_for((6,), classes, ignore_index=1))
    check(ours(lx, lt), theirs(tx, tt), [(lx, tx)])

    lx, tx = pair(rng.standard_normal((6, classes)))
    check(nn.NLLLoss(reduction="none")(nn.LogSoftmax(dim=1)(lx), lt),
          torch.nn.NLLLoss(reduction="none")(torch.nn.LogSoftmax(dim=1)(tx), tt), [(lx, tx)])

    lx, tx = pair(rng.standard_normal((3, 4)))
    ly, ty = pair(rng.standard_normal((3, 4)))
    check(nn.MSELoss()(lx, ly), torch.nn.MSELoss()(tx, ty), [(lx, tx), (ly, ty)])

    lx, tx = pair(rng.standard_normal((3, 4)))
    ly, ty = pair(rng.random((3, 4)))
    lp, tp = pair(rng.random(4) + 0.5, requires_grad=False)
    ours = nn.BCEWithLogitsLoss(pos_weight=lp)
    theirs = torch.nn.BCEWithLogitsLoss(pos_weight=tp)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["pos_weight"]
    check(ours(lx, ly), theirs(tx, ty), [(lx, tx), (ly, ty)])

    lx, tx = pair(rng.standard_normal((3, 4)))
    ly, ty = pair(rng.standard_normal((3, 4)))
    check(nn.SmoothL1Loss(beta=0.5, reduction="none")(lx, ly),
          torch.nn.SmoothL1Loss(beta=0.5, reduction="none")(tx, ty), [(lx, tx), (ly, ty)])
    check(nn.L1Loss()(lx.detach(), ly), torch.nn.L1Loss()(tx.detach(), ty), [(ly, ty)])


def test_loss_modules_repr_and_bad_reduction():
    assert repr(nn.MSELoss(reduction="sum")) == "MSELoss(reduction='sum')"
    with pytest.raises(ValueError, match="reduction must be"):
        nn.MSELoss(reduction="avg")
