"""MoL's layer: an untrained MoL returns the default layer (LLaVA's -2), π sums to 1, patch routing
with equal logits is image routing, top-k, gradients, the instruction embedding, refusals."""

from __future__ import annotations

import pytest
import torch

from mixlab.attention_arch.mol import MixtureOfLayers, instruction_embedding

torch.set_num_threads(1)

D, E, LAYERS = 16, 12, 6  # width, instruction width, encoder blocks (7 hidden states)


def hidden_states(batch=2, tokens=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, tokens, D, generator=generator) * (1 + i)
                 for i in range(LAYERS + 1))  # fmt: skip


def mol(**kwargs):
    return MixtureOfLayers(D, E, kwargs.pop("layers", (2, 4, -2, -1)), LAYERS, **kwargs)


@pytest.mark.parametrize("granularity", ["image", "patch", "hybrid"])
def test_an_untrained_mol_returns_the_default_layer(granularity):
    states, e = hidden_states(), torch.randn(2, E)
    out = mol(granularity=granularity)(states, e)
    torch.testing.assert_close(out.features, states[-2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(out.weights.shape[:-1]))


def perturbed(module, seed=1):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator))
    return module


def test_weights_are_a_distribution_per_token_and_follow_the_instruction():
    layer = perturbed(mol(granularity="hybrid"))
    states = hidden_states()
    a = layer(states, torch.randn(2, E)).weights
    assert a.shape == (2, 5, 4)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 5))
    assert bool((a >= 0).all())
    assert not torch.allclose(a, layer(states, torch.randn(2, E)).weights)


def test_patch_routing_with_equal_logits_is_image_routing():
    image = perturbed(mol(granularity="image"))
    hybrid = mol(granularity="hybrid")
    hybrid.image_router.load_state_dict(image.image_router.state_dict())
    hybrid.norms.load_state_dict(image.norms.state_dict())
    states, e = hidden_states(), torch.randn(2, E)
    # the patch router is zero at init: the same logit for every layer at every token
    torch.testing.assert_close(hybrid(states, e).features, image(states, e).features)
    torch.testing.assert_close(hybrid(states, e).weights[:, 0], image(states, e).weights)


def test_top_k_keeps_k_layers_renormalised():
    out = perturbed(mol(granularity="image", top_k=2))(hidden_states(), torch.randn(2, E))
    assert bool(((out.weights > 0).sum(-1) == 2).all())
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2))


def test_gradients_reach_the_routers_and_norms_not_the_frozen_states():
    layer = mol(granularity="hybrid")
    states = tuple(s.requires_grad_(False) for s in hidden_states())
    out = layer(states, torch.randn(2, E))
    (out.features.pow(2).mean() + out.balance_loss).backward()
    for name in ("image_router.2.weight", "patch_router.2.weight", "norms.0.weight"):
        grad = dict(layer.named_parameters())[name].grad
        assert grad is not None, name
        assert grad.abs().sum() > 0, name
    assert all(s.grad is None for s in states)


def test_instruction_embedding_is_the_mean_over_text_tokens():
    embeddings = torch.arange(12.0).view(1, 4, 3)
    mask = torch.tensor([[1, 0, 1, 0]])
    torch.testing.assert_close(
        instruction_embedding(embeddings, mask), torch.tensor([[3.0, 4.0, 5.0]])
    )
    with pytest.raises(ValueError, match="at least one text token"):
        instruction_embedding(embeddings, torch.zeros(1, 4))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": (2, 9)}, "layers must be indices into the 7 hidden states"),
        ({"layers": ()}, "layers must be a non-empty set"),
        ({"layers": (1, 2)}, "default_layer must be one of the candidate layers"),
        ({"top_k": 5}, "top_k must be None or an integer in"),
        ({"granularity": "region"}, "granularity must be one of"),
        ({"temperature": 0.0}, "temperature must be a number > 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mol(**kwargs)
