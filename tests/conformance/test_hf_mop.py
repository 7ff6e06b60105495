"""transformers' contract for MoP's MLLM (issue 28), on tiny CLIP, Llama and GPT-2 models built
from configs:

- ``save_pretrained`` → ``from_pretrained`` gives identical logits; the saved ``lm/`` loads on
  its own with ``AutoModelForCausalLM`` and ``encoder/`` with ``CLIPVisionModel`` (strict);
- ``generate`` through :class:`PrivilegedMLLM` on a left-padded batch gives each row what it
  gives alone, for each modality served alone;
- the shared encoder's hidden states are CLIP's ``output_hidden_states`` when the tokenizer holds
  CLIP's own patch embedding (``test_mop_encoder.py`` checks that one).
"""

import pytest
import torch

from mixlab.vision_mm.mop.encoder import SharedEncoder
from mixlab.vision_mm.mop.model import PrivilegedMLLM
from mixlab.vision_mm.mop.probes import MixtureOfProbes

torch.set_num_threads(1)
MODALITIES = {"rgb": (3, 32, 8), "depth": (1, 32, 8)}


def tiny(lm_kind: str) -> PrivilegedMLLM:
    from transformers import (
        CLIPVisionConfig,
        CLIPVisionModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(0)
    clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                            num_attention_heads=4, image_size=32, patch_size=8))  # fmt: skip
    if lm_kind == "llama":
        lm = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, pad_token_id=0))  # fmt: skip
    else:
        lm = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0
            )
        )
    connector = MixtureOfProbes(32, 4, num_probes=2, queries=3, layers=[1, 3], combine="concat")
    model = PrivilegedMLLM(SharedEncoder(clip, MODALITIES), connector, lm).eval()
    with torch.no_grad():  # away from the initialisation, so a part that fails to load shows
        for p in [
            *model.connector.parameters(),
            *model.projector.parameters(),
            *model.encoder.tokenizers.parameters(),
        ]:
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("lm_kind", ["llama", "gpt2"])
def test_save_pretrained_round_trip_and_parts_load_with_transformers(tmp_path, lm_kind):
    from transformers import AutoModelForCausalLM, CLIPVisionModel

    model = tiny(lm_kind)
    model.save_pretrained(tmp_path / "m")
    loaded = PrivilegedMLLM.from_pretrained(tmp_path / "m")
    ids = torch.randint(1, 40, (2, 6))
    for modality, channels in (("rgb", 3), ("depth", 1)):
        images = torch.rand(2, channels, 32, 32)
        with torch.no_grad():
            assert torch.equal(
                loaded(modality, images, ids).logits, model(modality, images, ids).logits
            )
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "m" / "lm").eval()
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, model.lm(ids).logits)
    _, info = CLIPVisionModel.from_pretrained(tmp_path / "m" / "encoder", output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]


@pytest.mark.parametrize("lm_kind", ["llama", "gpt2"])
def test_left_padded_generate_rows_equal_solo_runs(lm_kind):
    model = tiny(lm_kind)
    torch.manual_seed(1)
    rows = [torch.randint(1, 40, (n,)) for n in (3, 5, 4)]
    ids = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.zeros(3, 5, dtype=torch.long)
    for i, row in enumerate(rows):  # left padding
        ids[i, 5 - len(row) :] = row
        mask[i, 5 - len(row) :] = 1
    for modality, channels in (("rgb", 3), ("depth", 1)):
        images = torch.rand(3, channels, 32, 32)
        together = model.generate(
            modality, images, ids, mask, max_new_tokens=4, do_sample=False, pad_token_id=0
        )
        for i, row in enumerate(rows):
            alone = model.generate(modality, images[i : i + 1], row[None], max_new_tokens=4, do_sample=False,
                                   pad_token_id=0)  # fmt: skip
            assert torch.equal(together[i], alone[0])
