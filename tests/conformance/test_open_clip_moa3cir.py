"""open_clip's contract for MoA3CIR's towers (issue 29), on models built from configs and a named
architecture loaded from a local file (never from a hub):

- ``create_model("ViT-S-32", pretrained=<local file>)``: the towers' pooled outputs are the
  model's own ``encode_image`` / ``encode_text``, the tokens are its patch and text positions, the
  default tokenizer is ``get_tokenizer``'s; ``save_pretrained`` → ``from_pretrained`` rebuilds the
  architecture by name and gives the same query and gallery embeddings;
- a ``CustomTextCLIP`` (text tower as a ``TextTransformer``) goes through its ``output_tokens``;
- an image encoder without patch tokens (a ModifiedResNet) is refused with a clear error.
"""

import pytest
import torch

torch.set_num_threads(1)


def test_named_architecture_from_a_local_file(tmp_path):
    import open_clip

    from mixlab.vision_mm.moa3cir.model import CIRModel, MoA3CIR
    from mixlab.vision_mm.moa3cir.towers import ClipTowers

    torch.manual_seed(0)
    source = open_clip.create_model("ViT-S-32", pretrained=None)
    torch.save(source.state_dict(), tmp_path / "vit-s-32.pt")
    clip = open_clip.create_model("ViT-S-32", pretrained=str(tmp_path / "vit-s-32.pt")).eval()
    towers = ClipTowers(clip)
    texts = ["a red striped tee in cotton", "make it blue"]
    ids = towers.tokenize(texts)
    assert torch.equal(ids, open_clip.get_tokenizer("ViT-S-32")(texts))
    images = torch.rand(2, 3, 224, 224)
    with torch.no_grad():
        image, text = towers.image(images), towers.text(ids)
        assert torch.allclose(
            image.pooled, clip.encode_image((images - towers.mean) / towers.std), atol=1e-4
        )
        assert torch.allclose(text.pooled, clip.encode_text(ids), atol=1e-4)
    assert image.tokens.shape == (2, 49, 384)
    assert text.tokens.shape == (2, 77, 384)

    model = MoA3CIR(towers, dim=64, heads=8, groups=2, shared_heads=2).eval()
    with torch.no_grad():
        model.head.out.weight.normal_()
        query = model.encode_query(images, ["make it blue", "with dots"], texts)
        gallery = model.encode_target(images, texts)
    model.save_pretrained(tmp_path / "model", {"name": "ViT-S-32"})
    loaded = CIRModel.from_pretrained(tmp_path / "model")
    with torch.no_grad():
        assert torch.allclose(
            loaded.encode_query(images, ["make it blue", "with dots"], texts), query, atol=1e-5
        )
        assert torch.allclose(loaded.encode_target(images, texts), gallery, atol=1e-5)


def test_custom_text_clip_uses_its_text_transformer():
    import open_clip

    from mixlab.vision_mm.moa3cir.towers import ClipTowers

    torch.manual_seed(0)
    clip = open_clip.CustomTextCLIP(
        embed_dim=16,
        vision_cfg={"image_size": 16, "patch_size": 4, "width": 16, "layers": 1, "head_width": 8},
        text_cfg={"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    ).eval()
    towers = ClipTowers(clip)
    ids = towers.tokenize(["a black bag", "make it long"])
    with torch.no_grad():
        text = towers.text(ids)
        assert torch.allclose(text.pooled, clip.encode_text(ids), atol=1e-5)
    assert text.tokens.shape == (2, 16, 16)
    assert text.padding.shape == (2, 16)
    assert clip.text.output_tokens is False  # restored after the call


def test_image_encoder_without_patch_tokens_is_refused():
    import open_clip

    from mixlab.vision_mm.moa3cir.towers import ClipTowers

    resnet = open_clip.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "layers": (1, 1, 1, 1), "width": 16, "head_width": 8},
        text_cfg={"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    )
    with pytest.raises(ValueError, match="VisionTransformer image encoder"):
        ClipTowers(resnet)
