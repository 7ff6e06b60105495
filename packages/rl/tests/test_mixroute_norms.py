"""MixNorm reduces to each of its sources, keeps running batch statistics, and the adaptive gate
starts as the static mix."""

import pytest
import torch
import torch.nn.functional as F

from mixlab.rl.mixroute.norms import NORMS, MixNorm, make_norm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _one_hot(norm: MixNorm, index: int) -> None:
    with torch.no_grad():
        for logits in (norm.mean_logits, norm.var_logits):
            logits.fill_(-30.0)
            logits[index] = 30.0


def test_mixnorm_with_instance_weights_equals_instance_norm():
    h = torch.randn(4, 7, 16) * 3 + 1
    norm = MixNorm(16)
    _one_hot(norm, 0)
    expected = F.instance_norm(h.transpose(1, 2), eps=1e-5).transpose(1, 2)
    torch.testing.assert_close(norm(h), expected, atol=1e-5, rtol=1e-5)


def test_mixnorm_with_node_weights_equals_layer_norm_per_node():
    h = torch.randn(4, 7, 16)
    norm = MixNorm(16)
    _one_hot(norm, 1)
    torch.testing.assert_close(norm(h), F.layer_norm(h, (16,), eps=1e-5), atol=1e-5, rtol=1e-5)


def test_mixnorm_with_batch_weights_equals_batch_norm_in_training_and_evaluation():
    h = torch.randn(4, 7, 16) * 2
    norm, reference = MixNorm(16), torch.nn.BatchNorm1d(16)
    _one_hot(norm, 2)
    torch.testing.assert_close(
        norm(h), reference(h.reshape(-1, 16)).reshape(h.shape), atol=1e-5, rtol=1e-5
    )
    norm.eval(), reference.eval()
    torch.testing.assert_close(
        norm(h), reference(h.reshape(-1, 16)).reshape(h.shape), atol=1e-5, rtol=1e-5
    )


def test_adaptive_gate_starts_as_the_static_mix_and_learns():
    h = torch.randn(3, 5, 8)
    static, adaptive = MixNorm(8), MixNorm(8, adaptive=True)
    torch.testing.assert_close(adaptive(h), static(h))
    adaptive(h).square().sum().backward()
    assert adaptive.gate[-1].weight.grad.abs().sum() > 0
    assert adaptive.weights(h)["mean"].shape == (3, 3)


@pytest.mark.parametrize("kind", NORMS)
def test_every_norm_keeps_the_shape_and_refuses_a_wrong_width(kind):
    norm = make_norm(kind, 8)
    assert norm(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    if kind != "none":
        with pytest.raises(ValueError, match=r"embeddings must have shape \[batch, nodes, 8\]"):
            norm(torch.randn(2, 5, 6))


def test_one_hot_instance_weights_equal_torch_instance_norm_with_its_affine():
    h = torch.randn(3, 9, 8) * 2 - 1
    norm, reference = MixNorm(8), torch.nn.InstanceNorm1d(8, affine=True)
    _one_hot(norm, 0)
    with torch.no_grad():
        for ours, theirs in ((norm.weight, reference.weight), (norm.bias, reference.bias)):
            theirs.copy_(torch.randn(8))
            ours.copy_(theirs)
    expected = reference(h.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(norm(h), expected, atol=1e-5, rtol=1e-5)
    norm.eval()  # instance statistics do not depend on the mode
    torch.testing.assert_close(norm(h), expected, atol=1e-5, rtol=1e-5)


def test_the_fixed_blend_keeps_equal_weights_through_training():
    h = torch.randn(3, 5, 8)
    fixed, learned = MixNorm(8, learn_weights=False), MixNorm(8)
    torch.testing.assert_close(fixed(h), learned(h))  # both start at weights 1/3
    assert not [name for name, _ in fixed.named_parameters() if "logits" in name]
    assert {"mean_logits", "var_logits"} <= set(fixed.state_dict())  # saved with the model
    optimizer = torch.optim.Adam(fixed.parameters(), lr=0.1)
    fixed(h).square().sum().backward()
    optimizer.step()
    torch.testing.assert_close(fixed.weights()["mean"], torch.full((3,), 1 / 3))
    assert isinstance(make_norm("mixnorm-fixed", 8), MixNorm)
    with pytest.raises(ValueError, match="adaptive=True needs learn_weights=True"):
        MixNorm(8, adaptive=True, learn_weights=False)
