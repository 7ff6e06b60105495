"""MoL inside a transformers LLaVA: an untrained MoL is LLaVA's ``get_image_features`` (CLIP and
SigLIP towers), hooked states equal ``hidden_states``, timm and open_clip towers, gradients reach
router and projector but not the encoder, ``generate``, the concat baseline's widened projector,
the router saved alone, resume after a kill, and the refusals."""

from __future__ import annotations

import pytest
import torch

from mixlab.attention_arch.mol import (
    FixedLayer,
    LayerConcat,
    MoLLlava,
    encode_prompts,
    hooked_hidden_states,
    vision_hidden_states,
)
from mixlab.attention_arch.mol.data import image_token_count
from mixlab.attention_arch.mol.tasks import make_vqa
from mixlab.attention_arch.mol.toy import ToySpec, toy_config, toy_tokenizer

torch.set_num_threads(1)

SPEC = ToySpec(size=32, patch_size=8, vision_width=16, vision_depth=4, vision_heads=2, lm_width=16,
               lm_depth=1, lm_heads=2)  # fmt: skip


def tiny_llava(vision_config=None, strategy="default", seed=0):
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = toy_tokenizer()
    config = toy_config(SPEC, tokenizer)
    if vision_config is not None:
        config.vision_config = vision_config
    config.vision_feature_select_strategy = strategy
    return LlavaForConditionalGeneration(config).eval(), tokenizer


def batch(llava, tokenizer, n=3, answers=True, left_pad=False):
    data = make_vqa(n, size=SPEC.size, seed=1)
    prompts = encode_prompts(tokenizer, data.questions, data.answers if answers else None,
                             image_tokens=image_token_count(llava.config), left_pad=left_pad)  # fmt: skip
    return data.images, prompts


def llava_features(llava, pixels):
    out = llava.model.get_image_features(
        pixels, vision_feature_layer=llava.config.vision_feature_layer,
        vision_feature_select_strategy=llava.config.vision_feature_select_strategy,
    )  # fmt: skip
    return torch.stack(list(out.pooler_output))


@pytest.mark.parametrize("granularity", ["image", "patch", "hybrid", "static", "uniform"])
def test_an_untrained_mol_is_llavas_own_image_features(granularity):
    llava, tokenizer = tiny_llava()
    model = MoLLlava.from_llava(llava, [1, 2, 3, 4], granularity=granularity)
    pixels, prompts = batch(llava, tokenizer)
    features, mixed = model.mix(prompts.input_ids, prompts.attention_mask, pixel_values=pixels)
    expected = llava_features(llava, pixels)
    if granularity == "uniform":  # the only blend that does not start on the default layer
        assert not torch.allclose(features, expected, atol=1e-3)
        return
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed.weights.sum(-1), torch.ones(mixed.weights.shape[:-1]))
    with torch.no_grad():  # and the logits through mm_encoder_outputs are LLaVA's on the pixels
        ours = model(prompts.input_ids, prompts.attention_mask, pixel_values=pixels).logits
        theirs = llava(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                       pixel_values=pixels).logits  # fmt: skip
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_a_siglip_tower_without_cls_keeps_every_token():
    from transformers import SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                num_attention_heads=2, image_size=32, patch_size=8)  # fmt: skip
    llava, tokenizer = tiny_llava(vision, strategy="full")
    assert image_token_count(llava.config) == 16  # SigLIP has no CLS token
    model = MoLLlava.from_llava(llava, [1, 2, 3], granularity="hybrid")
    pixels, prompts = batch(llava, tokenizer)
    features, _ = model.mix(prompts.input_ids, prompts.attention_mask, pixel_values=pixels)
    torch.testing.assert_close(features, llava_features(llava, pixels), atol=1e-5, rtol=1e-5)


def test_hooked_states_of_a_hf_clip_equal_its_hidden_states():
    llava, _ = tiny_llava()
    tower = llava.model.vision_tower
    pixels = make_vqa(2, size=SPEC.size).images
    native = vision_hidden_states(tower, pixels)
    hooked = hooked_hidden_states(tower.encoder.layers, lambda: tower(pixels))
    assert len(native) == len(hooked) == SPEC.vision_depth + 1
    for a, b in zip(native, hooked, strict=True):
        torch.testing.assert_close(a, b)


def test_timm_and_open_clip_towers_give_every_layer():
    import open_clip
    import timm

    pixels = torch.randn(2, 3, 32, 32)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                            depth=3, embed_dim=32, num_heads=2).eval()  # fmt: skip
    states = vision_hidden_states(vit, pixels)
    assert len(states) == 4
    assert states[0].shape == (2, 17, 32)
    torch.testing.assert_close(vit.norm(states[-1]), vit.forward_features(pixels))
    tower = open_clip.transformer.VisionTransformer(
        image_size=32, patch_size=8, width=32, layers=3, heads=2, mlp_ratio=2.0, output_dim=16
    ).eval()  # fmt: skip
    states = vision_hidden_states(tower, pixels)
    assert len(states) == 4
    assert all(s.shape == (2, 17, 32) for s in states)
    from mixlab.attention_arch.mol import MixtureOfLayers

    mol = MixtureOfLayers(32, 8, [1, 2, 3], 3, granularity="hybrid")
    torch.testing.assert_close(
        mol(states, torch.randn(2, 8)).features, states[-2], atol=1e-5, rtol=1e-5
    )


def test_gradients_reach_router_and_projector_not_the_encoder():
    from mixlab.attention_arch.mol.training import trainable_parameters

    llava, tokenizer = tiny_llava()
    model = MoLLlava.from_llava(llava, [1, 2, 3], granularity="hybrid", default_bias=2.0)
    trainable_parameters(model, "projector")
    pixels, prompts = batch(llava, tokenizer)
    out = model(
        prompts.input_ids, prompts.attention_mask, pixel_values=pixels, labels=prompts.labels
    )
    out.loss.backward()
    for name in ("image_router", "patch_router"):
        assert any(p.grad is not None and p.grad.abs().sum() > 0
                   for p in getattr(model.mol, name).parameters())  # fmt: skip
    assert llava.model.multi_modal_projector.linear_1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in llava.model.vision_tower.parameters())
    assert all(p.grad is None for p in llava.model.language_model.parameters())


def test_generate_through_the_wrapper_is_llavas_generate_when_untrained():
    llava, tokenizer = tiny_llava()
    model = MoLLlava.from_llava(llava, [2, 3, 4])
    pixels, prompts = batch(llava, tokenizer, answers=False, left_pad=True)
    ours = model.generate(prompts.input_ids, prompts.attention_mask, pixel_values=pixels,
                          max_new_tokens=3, do_sample=False)  # fmt: skip
    theirs = llava.generate(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                            pixel_values=pixels, max_new_tokens=3, do_sample=False)  # fmt: skip
    assert ours.shape[1] == prompts.input_ids.shape[1] + 3
    assert torch.equal(ours, theirs)


def test_the_concat_baseline_starts_at_the_base_and_saves_like_transformers(tmp_path):
    from transformers import LlavaForConditionalGeneration

    llava, tokenizer = tiny_llava()
    pixels, prompts = batch(llava, tokenizer)
    expected = llava_features(llava, pixels)
    model = MoLLlava(llava, LayerConcat([1, 3, 4], SPEC.vision_depth))
    assert llava.model.multi_modal_projector.linear_1.in_features == 3 * SPEC.vision_width
    features, _ = model.mix(prompts.input_ids, prompts.attention_mask, pixel_values=pixels)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)
    llava.save_pretrained(tmp_path)  # transformers' own multi-layer path reads the same concat
    loaded = LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.config.vision_feature_layer == [1, 3, 4]
    torch.testing.assert_close(llava_features(loaded, pixels), expected, atol=1e-5, rtol=1e-5)


def test_the_router_saves_and_loads_alone(tmp_path):
    llava, tokenizer = tiny_llava()
    model = MoLLlava.from_llava(llava, [1, 2, 3, 4], granularity="hybrid", top_k=2)
    with torch.no_grad():
        for p in model.mol.parameters():
            p.add_(torch.randn_like(p))
    model.save_router(tmp_path / "mol")
    loaded = MoLLlava.load_router(tiny_llava()[0], tmp_path / "mol")
    assert loaded.mol.top_k == 2
    assert loaded.mol.layers == [1, 2, 3, 4]
    pixels, prompts = batch(llava, tokenizer)
    a = model.mix(prompts.input_ids, prompts.attention_mask, pixel_values=pixels)[1]
    b = loaded.mix(prompts.input_ids, prompts.attention_mask, pixel_values=pixels)[1]
    torch.testing.assert_close(a.weights, b.weights)


def test_the_adapter_carries_a_fine_tuned_projector(tmp_path):
    """``mol.safetensors`` + ``mol.json`` + ``projector.safetensors``: a fresh base wrapped from
    the adapter gives the trained model's logits; without the projector it does not."""
    from mixlab.attention_arch.mol.training import TrainSpec, train

    llava, tokenizer = tiny_llava()
    model = MoLLlava.from_llava(llava, [1, 2, 3, 4], granularity="hybrid")
    pixels, prompts = batch(llava, tokenizer, n=6)

    def batch_of(index):
        return model.vision_states(pixels[index]), prompts.select(index)

    train(model, batch_of, 6, TrainSpec(steps=3, batch_size=4, lr=1e-2, trainable="projector"))
    model.save_router(tmp_path / "adapter")
    model.save_router(tmp_path / "router-only", projector=False)
    assert (tmp_path / "adapter" / "projector.safetensors").is_file()
    assert not (tmp_path / "router-only" / "projector.safetensors").exists()

    def logits(wrapped):
        return wrapped(prompts.input_ids, prompts.attention_mask, pixel_values=pixels).logits

    with torch.no_grad():
        expected = logits(model)
        torch.testing.assert_close(
            logits(MoLLlava.load_router(tiny_llava()[0], tmp_path / "adapter")), expected
        )
        partial = MoLLlava.load_router(tiny_llava()[0], tmp_path / "router-only")
        assert (logits(partial) - expected).abs().max() > 1e-3


def test_llava_next_is_refused_with_a_clear_error():
    """LLaVA-NeXT packs anyres crops with newline tokens; MoL mixes one grid, so it says so."""
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    config = toy_config(SPEC, toy_tokenizer())
    next_config = LlavaNextConfig(
        vision_config=config.vision_config, text_config=config.text_config,
        image_token_index=config.image_token_id, image_grid_pinpoints=[[32, 32], [32, 64]],
    )  # fmt: skip
    llava_next = LlavaNextForConditionalGeneration(next_config)
    with pytest.raises(ValueError, match="model must be a LlavaForConditionalGeneration"):
        MoLLlava.from_llava(llava_next, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="anyres"):
        MoLLlava(llava_next, FixedLayer(SPEC.vision_width, -2, SPEC.vision_depth))


def test_training_resumed_after_a_kill_ends_at_the_same_weights(tmp_path):
    from mixlab.attention_arch.mol.training import TrainSpec, train

    llava, tokenizer = tiny_llava()
    pixels, prompts = batch(llava, tokenizer, n=6)

    def run(folder, resume=False):
        model = MoLLlava.from_llava(tiny_llava()[0], [1, 2, 3], granularity="hybrid")

        def batch_of(index):
            return model.vision_states(pixels[index]), prompts.select(index)

        spec = TrainSpec(steps=6, batch_size=4, checkpoint_every=3, seed=0)
        train(model, batch_of, 6, spec, out_dir=folder, resume=resume)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    whole = run(tmp_path / "a")
    run(tmp_path / "b")  # leaves its step-3 checkpoint, as a run killed after step 3 would
    assert (tmp_path / "b" / "checkpoints").is_dir()
    resumed = run(tmp_path / "b", resume=True)
    torch.testing.assert_close(resumed, whole)


def test_refusals():
    llava, tokenizer = tiny_llava()
    with pytest.raises(
        ValueError, match="model must be a transformers LlavaForConditionalGeneration"
    ):
        MoLLlava(llava.model.language_model, FixedLayer(16, -2, 4))
    with pytest.raises(ValueError, match="layers"):
        MoLLlava.from_llava(llava, [1, 9])
    with pytest.raises(ValueError, match="layers"):
        MoLLlava.from_llava(llava, [])
    with pytest.raises(ValueError, match="top_k"):
        MoLLlava.from_llava(llava, [2, 3], top_k=3)
    with pytest.raises(ValueError, match="granularity"):
        MoLLlava.from_llava(llava, [2, 3], granularity="token")
    model = MoLLlava.from_llava(llava, [2, 3])
    pixels, _ = batch(llava, tokenizer)
    image_only = torch.full((3, 17), llava.config.image_token_id)
    image_only[:, 0] = tokenizer.bos_token_id
    with pytest.raises(ValueError, match="instruction.* without text tokens|text tokens"):
        model.mix(image_only, pixel_values=pixels)
    with pytest.raises(ValueError, match="pixel_values"):
        model.mix(image_only)
