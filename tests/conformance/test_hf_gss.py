"""GSS's steer as a Hugging Face hook: inside ``model.generate`` with a tokenizer's left-padded
batch (rows equal their solo runs), beam search and sampling, the ``text-generation`` pipeline,
``output_hidden_states`` (the steered layer reports the steered state), and a saved model that
does not carry the hook."""

import pytest
import torch
from transformers import LlamaForCausalLM, pipeline

from mixlab.llm_efficiency.gss import fit_gss
from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

PROMPTS = ["+123:456 ", "*713:210 931 ", "+9:1 "]


@pytest.fixture(scope="module")
def tokenizer():
    return reasoning_tokenizer()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LMConfig(hidden_size=32, layers=2, heads=2, intermediate_size=64)
    return LlamaForCausalLM(
        llama_config(config, vocab_size=260, eos_token_id=257, pad_token_id=256)
    ).eval()


@pytest.fixture(scope="module")
def steer(model, tokenizer):
    texts = ["+274:105 379 543 717", "*313:268 664 862 466", "+111:222 333 444 555"]
    general = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n"] * 4
    ids = [tokenizer(t)["input_ids"] for t in texts]
    gen = [tokenizer(t)["input_ids"] for t in general]
    return fit_gss(model, ids, gen, layer=0, rank=2, quantile=0.5, strength=4.0)


def test_left_padded_batch_rows_equal_their_solo_runs(model, tokenizer, steer):
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert batch["attention_mask"][:, 0].eq(0).any()
    width = batch["input_ids"].shape[1]
    with steer:
        out = model.generate(**batch, max_new_tokens=10, do_sample=False)
        assert steer.any_gate_rate > 0
        for b, prompt in enumerate(PROMPTS):
            solo_in = tokenizer([prompt], return_tensors="pt")
            solo = model.generate(**solo_in, max_new_tokens=10, do_sample=False)
            assert out[b, width:].tolist() == solo[0, solo_in["input_ids"].shape[1] :].tolist()


def test_beam_search_and_sampling_run_under_the_hook(model, tokenizer, steer):
    batch = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with steer:
        beams = model.generate(**batch, max_new_tokens=8, num_beams=3, do_sample=False)
        torch.manual_seed(0)
        sampled = model.generate(**batch, max_new_tokens=8, do_sample=True, num_return_sequences=2)
    assert beams.shape[0] == 2
    assert sampled.shape[0] == 4


def test_text_generation_pipeline_runs_under_the_hook(model, tokenizer, steer):
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    plain = generator(PROMPTS[0], max_new_tokens=12, do_sample=False, return_tensors=True)
    with steer:
        steered = generator(PROMPTS[0], max_new_tokens=12, do_sample=False, return_tensors=True)
    assert steer.seen > 0
    assert steered[0]["generated_token_ids"] != plain[0]["generated_token_ids"]


def test_output_hidden_states_reports_the_steered_layer(model, tokenizer, steer):
    ids = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    plain = model(**ids, output_hidden_states=True).hidden_states
    with steer:
        steered = model(**ids, output_hidden_states=True).hidden_states
    assert torch.equal(steered[0], plain[0])  # before the steered block: untouched
    change, _ = steer.delta_h(plain[1])
    expected = plain[1] + change
    assert torch.allclose(steered[1], expected, atol=1e-6)


def test_a_saved_model_does_not_carry_the_hook(tmp_path, model, tokenizer, steer):
    ids = tokenizer(PROMPTS[:1], return_tensors="pt")["input_ids"]
    with steer:
        model.save_pretrained(tmp_path / "m")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
