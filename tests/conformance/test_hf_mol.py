"""transformers' contract for MoL's LLaVA wrapper (issue 23), on tiny LLaVAs built from configs:

- ``generate`` through :class:`MoLLlava` on a left-padded batch gives each row what it gives
  alone (the router reads each row's own instruction tokens, not the padding);
- the toy's ``LlavaProcessor`` (images and ``<image>`` prompts) builds the same ids as
  :func:`encode_prompts`, and its pixels are the experiment's;
- ``save_pretrained`` / ``from_pretrained`` of the LLaVA plus ``save_router`` / ``load_router``
  give identical logits; forward keyword arguments (``output_hidden_states``) pass through.
"""

import torch

from mixlab.attention_arch.mol import MoLLlava, encode_prompts
from mixlab.attention_arch.mol.data import image_token_count
from mixlab.attention_arch.mol.tasks import make_vqa
from mixlab.attention_arch.mol.toy import ToySpec, toy_config, toy_processor, toy_tokenizer

torch.set_num_threads(1)
SPEC = ToySpec(size=32, patch_size=8, vision_width=16, vision_depth=3, vision_heads=2, lm_width=16,
               lm_depth=1, lm_heads=2)  # fmt: skip


def trained_looking():
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(0)
    tokenizer = toy_tokenizer()
    llava = LlavaForConditionalGeneration(toy_config(SPEC, tokenizer)).eval()
    model = MoLLlava.from_llava(llava, [1, 2, 3], granularity="hybrid", default_bias=1.0)
    with torch.no_grad():
        for p in model.mol.parameters():
            p.add_(torch.randn_like(p))
    return model, tokenizer


def test_left_padded_generate_rows_equal_solo_runs():
    model, tokenizer = trained_looking()
    data = make_vqa(4, size=SPEC.size, seed=3)
    tokens = image_token_count(model.llava.config)
    batch = encode_prompts(tokenizer, data.questions, None, image_tokens=tokens, left_pad=True)
    assert (batch.attention_mask == 0).any()  # the questions differ in length
    together = model.generate(batch.input_ids, batch.attention_mask, pixel_values=data.images,
                              max_new_tokens=3, do_sample=False)  # fmt: skip
    for i in range(4):
        solo = encode_prompts(tokenizer, data.questions[i : i + 1], None, image_tokens=tokens)
        alone = model.generate(solo.input_ids, solo.attention_mask, pixel_values=data.images[i : i + 1],
                               max_new_tokens=3, do_sample=False)  # fmt: skip
        assert torch.equal(together[i, -3:], alone[0, -3:])
        mixed = model.mix(batch.input_ids[i : i + 1], batch.attention_mask[i : i + 1],
                          pixel_values=data.images[i : i + 1])[1]  # fmt: skip
        solo_mixed = model.mix(
            solo.input_ids, solo.attention_mask, pixel_values=data.images[i : i + 1]
        )[1]
        torch.testing.assert_close(mixed.weights, solo_mixed.weights)


def test_the_processor_builds_the_experiments_inputs():
    from PIL import Image

    tokenizer = toy_tokenizer()
    processor = toy_processor(tokenizer, SPEC)
    data = make_vqa(2, size=SPEC.size, seed=4)
    pixels = ((data.images + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    images = [Image.fromarray(p) for p in pixels]
    texts = [f"<image> {q}" for q in data.questions]
    out = processor(images=images, text=texts, padding=True, return_tensors="pt")
    config = toy_config(SPEC, tokenizer)
    ours = encode_prompts(tokenizer, data.questions, None, image_tokens=image_token_count(config))
    assert torch.equal(out["input_ids"], ours.input_ids)
    torch.testing.assert_close(out["pixel_values"], data.images, atol=1 / 127, rtol=0)


def test_save_and_load_give_identical_logits(tmp_path):
    from transformers import LlavaForConditionalGeneration

    model, tokenizer = trained_looking()
    data = make_vqa(2, size=SPEC.size, seed=5)
    prompts = encode_prompts(tokenizer, data.questions, data.answers,
                             image_tokens=image_token_count(model.llava.config))  # fmt: skip
    model.llava.save_pretrained(tmp_path / "llava")
    model.save_router(tmp_path / "llava" / "mol")
    loaded = MoLLlava.load_router(LlavaForConditionalGeneration.from_pretrained(tmp_path / "llava").eval(),
                                  tmp_path / "llava" / "mol")  # fmt: skip
    with torch.no_grad():
        a = model(prompts.input_ids, prompts.attention_mask, pixel_values=data.images,
                  output_hidden_states=True)  # fmt: skip
        b = loaded(prompts.input_ids, prompts.attention_mask, pixel_values=data.images)
    assert len(a.hidden_states) == SPEC.lm_depth + 1
    torch.testing.assert_close(a.logits, b.logits, atol=0, rtol=0)
