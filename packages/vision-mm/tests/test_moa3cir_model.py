"""MoA3CIR's parts at tiny sizes: the towers against open_clip, MoA³ against multi-head attention,
the combiner against CLIP4Cir's equations, the index against per-query encodings, recall@K
against a brute-force count, the catalogue's triplets, and the errors users meet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mixlab.vision_mm.moa3cir.attention import MoA3Attention, balance_loss, routing_statistics
from mixlab.vision_mm.moa3cir.model import (
    CIRModel,
    Combiner,
    MoA3CIR,
    QueryFeatures,
    RetrievalIndex,
    SimpleHead,
    build_head,
    recall_at_k,
    target_ranks,
)  # fmt: skip
from mixlab.vision_mm.moa3cir.towers import ClipTowers, Encoded, tiny_clip

TINY_CLIP = dict(
    embed_dim=16, width=16, layers=1, heads=2, image_size=16, patch_size=4, context_length=16
)


@pytest.fixture(scope="module")
def towers():
    torch.manual_seed(0)
    return ClipTowers(tiny_clip(**TINY_CLIP))


def _features(batch: int = 3, seed: int = 0) -> QueryFeatures:
    g = torch.Generator().manual_seed(seed)

    def enc(length: int, padded: bool) -> Encoded:
        padding = torch.zeros(batch, length, dtype=torch.bool)
        if padded:
            padding[:, length // 2 :] = True
        return Encoded(torch.randn(batch, 16, generator=g), torch.randn(batch, length, 16, generator=g),
                       padding if padded else None)  # fmt: skip

    return QueryFeatures(enc(16, False), enc(16, True), enc(16, True))


# ------------------------------------------------------------------------------------ towers
def test_towers_pool_as_open_clip_encodes(towers):
    ids = towers.tokenize(["a red dotted dress", "make it blue"])
    text = towers.text(ids)
    clip = towers.model("modification")
    assert torch.allclose(text.pooled, clip.encode_text(ids), atol=1e-5)
    assert text.tokens.shape == (2, 16, 16)
    assert text.padding[0].sum() == 16 - 6
    images = torch.rand(2, 3, 16, 16)
    image = towers.image(images)
    assert torch.allclose(
        image.pooled, clip.encode_image((images - towers.mean) / towers.std), atol=1e-5
    )
    assert image.tokens.shape == (2, 16, 16)


def test_unshared_towers_are_five_copies(towers):
    apart = ClipTowers(tiny_clip(**TINY_CLIP), share="none")
    first, second = apart.model("reference_image"), apart.model("target_image")
    assert first is not second
    generator = torch.Generator().manual_seed(0)  # not the global stream: order-independent
    with torch.no_grad():  # a random change of the projection (a constant added after the
        # LayerNorm would cancel: its output sums to zero over the features)
        first.visual.proj.add_(torch.randn(first.visual.proj.shape, generator=generator))
    images = torch.rand(2, 3, 16, 16, generator=generator)
    reference = apart.image(images, "reference_image").pooled
    target = apart.image(images, "target_image").pooled
    assert (reference - target).abs().max() > 0.1 * target.abs().max()
    with pytest.raises(ValueError, match="share must be one of"):
        ClipTowers(tiny_clip(**TINY_CLIP), share="some")


# ------------------------------------------------------------------------------------- MoA³
def test_one_group_moa3_without_router_is_multi_head_attention():
    torch.manual_seed(0)
    moa3 = MoA3Attention(32, 4, groups=1, routed=False)
    reference = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(moa3.in_proj.weight)
        reference.in_proj_bias.copy_(moa3.in_proj.bias)
        reference.out_proj.weight.copy_(moa3.out_proj.weight)
        reference.out_proj.bias.copy_(moa3.out_proj.bias)
    x = torch.randn(3, 9, 32)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[1, 6:] = True
    ours, weights = moa3(x, key_padding_mask=padding)
    theirs, _ = reference(x, x, x, key_padding_mask=padding)
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.equal(weights, torch.ones(3, 1))


@pytest.mark.parametrize("options", [{}, {"top_k": 2}, {"per_token": True}, {"temperature": 0.3}])
def test_router_weights_sum_to_one(options):
    torch.manual_seed(0)
    moa3 = MoA3Attention(32, 8, groups=3, shared_heads=2, **options)
    out, weights = moa3(torch.randn(4, 7, 32), torch.randn(4, 32))
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]))
    if "top_k" in options:
        assert ((weights > 0).sum(-1) == 2).all()
    out.sum().backward()
    assert moa3.router.weight.grad.abs().sum() > 0  # the router learns through the heads' scale


def test_a_group_at_zero_weight_drops_its_heads():
    torch.manual_seed(0)
    moa3 = MoA3Attention(16, 4, groups=2, shared_heads=2, top_k=1)
    x, route = torch.randn(1, 5, 16), torch.randn(1, 16)
    out, weights = moa3(x, route)
    dropped = 1 - int(weights.argmax())  # its one head is head 2 + dropped
    with torch.no_grad():
        moa3.in_proj.weight[32 + 4 * (2 + dropped) : 32 + 4 * (3 + dropped)] += (
            5.0  # change its values only
        )
    assert torch.allclose(moa3(x, route)[0], out, atol=1e-6)


def test_routing_statistics_and_balance():
    weights = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    stats = routing_statistics(weights)
    assert stats["top_share"] == [1.0, 0.0]
    assert stats["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert float(balance_loss(weights)) == pytest.approx(2.0)
    assert float(balance_loss(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))) == pytest.approx(1.0)


def test_heads_not_dividing_into_groups_is_refused():
    with pytest.raises(ValueError, match="must split into groups = 3"):
        MoA3Attention(32, 8, groups=3)
    with pytest.raises(ValueError, match="top_k must be"):
        MoA3Attention(32, 8, groups=4, top_k=5)


# ----------------------------------------------------------------------------------- combiner
def test_combiner_matches_clip4cir_equations():
    torch.manual_seed(0)
    combiner = Combiner(16, 24, 32).eval()
    image, text = torch.randn(5, 16), torch.randn(5, 16)
    p_text = F.relu(
        text @ combiner.text_projection_layer.weight.T + combiner.text_projection_layer.bias
    )
    p_image = F.relu(
        image @ combiner.image_projection_layer.weight.T + combiner.image_projection_layer.bias
    )
    joint = torch.cat([p_text, p_image], -1)
    hidden = F.relu(joint @ combiner.combiner_layer.weight.T + combiner.combiner_layer.bias)
    first, _, _, last, _ = combiner.dynamic_scalar
    weight = torch.sigmoid(last(F.relu(first(joint))))
    expected = F.normalize(
        combiner.output_layer(hidden) + weight * text + (1 - weight) * image, dim=-1
    )
    features = QueryFeatures(Encoded(image, image[:, None]), Encoded(text, text[:, None]))
    assert torch.allclose(combiner.query(features), expected, atol=1e-6)
    assert torch.allclose(combiner.target(image), F.normalize(image, dim=-1))


def test_moa3_head_starts_at_sum_fusion_and_uses_descriptions():
    from mixlab.vision_mm.moa3cir.model import MoA3Head

    torch.manual_seed(0)
    head = MoA3Head(16, 16, 16, dim=16, heads=4, groups=2, shared_heads=2)
    f = _features()
    expected = F.normalize(f.image.pooled + f.text.pooled + f.description.pooled, dim=-1)
    assert torch.allclose(head.query(f), expected, atol=1e-6)  # zero-initialised output projection
    three = MoA3Head(16, 16, 16, dim=16, heads=4, groups=2, shared_heads=2, descriptions=False)
    assert torch.allclose(
        three.query(f), F.normalize(f.image.pooled + f.text.pooled, dim=-1), atol=1e-6
    )
    assert torch.allclose(
        three.target(f.image.pooled, f.text.pooled), F.normalize(f.image.pooled, dim=-1)
    )


def test_five_tower_sum_adds_the_descriptions_on_both_sides():
    f = _features()
    head = SimpleHead("sum", descriptions=True)
    expected = F.normalize(f.image.pooled + f.text.pooled + f.description.pooled, dim=-1)
    assert torch.allclose(head.query(f), expected)
    assert torch.allclose(
        head.target(f.image.pooled, f.text.pooled),
        F.normalize(f.image.pooled + f.text.pooled, dim=-1),
    )
    with pytest.raises(ValueError, match="descriptions go with kind 'sum'"):
        SimpleHead("image", descriptions=True)


# -------------------------------------------------------------------------------------- index
def test_index_equals_per_query_target_embeddings_and_survives_saving(towers, tmp_path):
    torch.manual_seed(0)
    model = MoA3CIR(towers, dim=16, heads=4, groups=2, shared_heads=2).eval()
    with torch.no_grad():
        model.head.out.weight.normal_()  # leave the sum-fusion start
    images = torch.rand(7, 3, 16, 16)
    descriptions = [
        f"a {c} dress" for c in ("red", "blue", "green", "black", "pink", "red", "blue")
    ]
    index = model.build_index(images, [f"item{i}" for i in range(7)], descriptions, batch_size=3)
    with torch.no_grad():
        one_by_one = torch.cat(
            [model.encode_target(images[i : i + 1], descriptions[i : i + 1]) for i in range(7)]
        )
    assert torch.allclose(index.embeddings, one_by_one, atol=1e-5)

    query = torch.rand(2, 3, 16, 16)
    scores, ids = model.search(
        index, query, ["make it blue", "with dots"], ["a red dress", "a tee"], k=4
    )
    index.save(tmp_path / "index.safetensors")
    again = RetrievalIndex.load(tmp_path / "index.safetensors")
    scores_again, ids_again = model.search(
        again, query, ["make it blue", "with dots"], ["a red dress", "a tee"], k=4
    )
    assert ids_again == ids
    assert torch.allclose(scores_again, scores)
    # a safetensors file of another kind, and a cut one, are refused by name (issue 80)
    from safetensors.torch import save_file

    save_file({"weight": torch.ones(2, 2)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match="is not an index written by RetrievalIndex.save"):
        RetrievalIndex.load(tmp_path / "weights.safetensors")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((tmp_path / "index.safetensors").read_bytes()[:40])
    with pytest.raises(ValueError, match="is not an index written by RetrievalIndex.save"):
        RetrievalIndex.load(cut)

    model.save_pretrained(tmp_path / "model", TINY_CLIP)
    loaded = CIRModel.from_pretrained(tmp_path / "model")
    assert torch.allclose(
        loaded.build_index(images, None, descriptions).embeddings, index.embeddings, atol=1e-6
    )


def test_recall_at_k_is_a_brute_force_count():
    g = torch.Generator().manual_seed(0)
    queries = F.normalize(torch.randn(40, 8, generator=g), dim=-1)
    gallery = F.normalize(torch.randn(30, 8, generator=g), dim=-1)
    targets = torch.randint(30, (40,), generator=g)
    recall = recall_at_k(target_ranks(queries, gallery, targets), (1, 5, 10))
    scores = (queries @ gallery.T).tolist()
    for k in (1, 5, 10):
        hits = 0
        for row, target in zip(scores, targets.tolist(), strict=True):
            order = sorted(range(30), key=lambda j: -row[j])
            hits += target in order[:k]
        assert recall[f"R@{k}"] == pytest.approx(hits / 40)


def test_bad_inputs_are_named(towers):
    model = CIRModel(towers, SimpleHead("sum"))
    with pytest.raises(ValueError, match="gallery is empty"):
        model.build_index(torch.zeros(0, 3, 16, 16))
    with pytest.raises(ValueError, match="descriptions and images must have the same count"):
        model.build_index(torch.rand(3, 3, 16, 16), descriptions=["a", "b"])
    with pytest.raises(ValueError, match="texts must be non-empty"):
        model.encode_query(torch.rand(2, 3, 16, 16), ["make it blue", "  "])
    index = model.build_index(torch.rand(3, 3, 16, 16))
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 3\]"):
        model.search(index, torch.rand(1, 3, 16, 16), ["make it red"], k=4)
    with pytest.raises(ValueError, match="images must be"):
        model.encode_query(torch.rand(1, 3, 20, 20), ["make it red"])


# ---------------------------------------------------------------------------------- catalogue
def test_triplets_change_exactly_the_stated_attributes():
    from mixlab.vision_mm.moa3cir.catalogue import ATTRIBUTES, all_items, is_held_out, make_triplets

    names = list(ATTRIBUTES)
    rng = np.random.default_rng(0)
    items = all_items()
    exact = make_triplets(items[rng.integers(len(items), size=200)], rng)
    for ref, tgt, stated in zip(exact.reference, exact.target, exact.stated, strict=True):
        assert {names[i] for i in np.flatnonzero(ref != tgt)} == set(stated)
    confounded = make_triplets(items[:200], rng, confound=1.0, allowed=~is_held_out(items))
    changes = (confounded.reference != confounded.target).sum(1)
    assert np.array_equal(changes, np.array([len(s) + 1 for s in confounded.stated]))
    assert not is_held_out(confounded.target).any()


def test_material_is_not_in_the_pixels():
    from mixlab.vision_mm.moa3cir.catalogue import render

    silk, leather = np.array([[1, 2, 3, 1, 3]]), np.array([[1, 2, 3, 1, 2]])
    assert np.array_equal(
        render(silk, np.random.default_rng(5)), render(leather, np.random.default_rng(5))
    )


def test_seeded_head_training_is_deterministic():
    from mixlab.vision_mm.moa3cir.model import MoA3Head
    from mixlab.vision_mm.moa3cir.training import TripletFeatures, train_head

    f = _features(batch=12)
    features = TripletFeatures(f, torch.randn(12, 16), torch.randn(12, 16))
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        head = MoA3Head(16, 16, 16, dim=16, heads=4, groups=2, shared_heads=2)
        runs.append(train_head(head, features, 5, batch_size=4, seed=3))
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][-1]


def test_combiner_reading_descriptions_adds_them_on_both_sides():
    torch.manual_seed(0)
    f = _features()
    plain, described = Combiner(16, 24, 32).eval(), Combiner(16, 24, 32, descriptions=True).eval()
    described.load_state_dict(plain.state_dict())
    image_side = QueryFeatures(
        Encoded(f.image.pooled + f.description.pooled, f.image.tokens), f.text
    )
    assert torch.allclose(described.query(f), plain.query(image_side), atol=1e-6)
    assert not torch.allclose(described.query(f), plain.query(f), atol=1e-3)
    assert torch.allclose(
        described.target(f.image.pooled, f.text.pooled),
        F.normalize(f.image.pooled + f.text.pooled, dim=-1),
    )
    assert build_head(described.config).uses_descriptions


def test_route_supervision_is_the_routers_nll_of_the_known_attributes():
    from mixlab.vision_mm.moa3cir.training import route_supervision_loss

    weights = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    attribute = torch.tensor([0, -1, 2])  # the second triplet's edit is not known
    expected = -(torch.log(torch.tensor(0.5)) + torch.log(torch.tensor(0.6))) / 2
    assert torch.isclose(route_supervision_loss(weights, attribute), expected)
    per_token = weights[:, None].expand(3, 4, 3)  # [B, L, G]: the mean over tokens
    assert torch.isclose(route_supervision_loss(per_token, attribute), expected)
    assert route_supervision_loss(weights, torch.full((3,), -1)) == 0


def test_supervised_router_sends_each_attribute_to_its_group():
    from mixlab.vision_mm.moa3cir.model import MoA3Head
    from mixlab.vision_mm.moa3cir.training import TripletFeatures, train_head

    generator = torch.Generator().manual_seed(0)
    attribute = torch.arange(64) % 4
    directions = torch.randn(4, 16, generator=generator)  # the modification text names the edit
    f = _features(batch=64)
    text = directions[attribute] + 0.1 * torch.randn(64, 16, generator=generator)
    f = QueryFeatures(f.image, Encoded(text, f.text.tokens, f.text.padding), f.description)
    features = TripletFeatures(f, torch.randn(64, 16, generator=generator), None, attribute)
    top = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(1)
        head = MoA3Head(16, 16, 16, dim=16, heads=8, groups=4, shared_heads=4)
        train_head(head, features, 60, batch_size=32, lr=1e-2, seed=0, route_supervision=weight)
        with torch.no_grad():
            head.query(f)
        top[weight] = (head.last_weights[0].argmax(-1) == attribute).float().mean().item()
    assert top[1.0] == 1.0  # every triplet's top group is its attribute's
    assert top[0.0] < 0.9  # the retrieval loss alone does not name the groups
    with pytest.raises(ValueError, match="route_supervision needs a router group per attribute"):
        train_head(MoA3Head(16, 16, 16, dim=16, heads=4, groups=2, shared_heads=2), features, 1,
                   route_supervision=1.0)  # fmt: skip
