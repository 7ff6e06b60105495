"""RPDI-EE and its baselines as Hugging Face ``LogitsProcessor``s: inside ``model.generate``
with a tokenizer's left-padded batch, ``LogitsProcessorList``, ``output_scores``,
``num_return_sequences``, the ``text-generation`` pipeline, and refusals of what they cannot
do (beam search, no KV cache for the probing baselines)."""

import pytest
import torch
from transformers import LlamaForCausalLM, LogitsProcessorList, pipeline

from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer
from mixlab.llm_efficiency.rpdi_ee import DynasorExitProcessor, RPDIExitProcessor, make_processor

PROMPTS = ["1 +2 x3 = <think>", "3 *2 x14 = <think>", "7 -3 x5 = <think>"]


@pytest.fixture(scope="module")
def tokenizer():
    return reasoning_tokenizer()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LMConfig(hidden_size=32, layers=2, heads=2, intermediate_size=64)
    m = LlamaForCausalLM(llama_config(config, vocab_size=260, eos_token_id=257, pad_token_id=256))
    with torch.no_grad():
        m.lm_head.weight.mul_(60)  # peaky: entropies vary enough for exits
        m.lm_head.weight[257].zero_()  # no early eos: rows run to the cap or their exit
    return m.eval()


def rpdi(tokenizer):
    return RPDIExitProcessor.from_tokenizer(tokenizer, window=3, threshold=1.2)


def test_left_padded_batch_rows_equal_their_solo_runs(model, tokenizer):
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert batch["attention_mask"][0, 0] == 0  # the shortest prompt is left-padded
    proc = rpdi(tokenizer)
    out = model.generate(**batch, max_new_tokens=20, do_sample=False, logits_processor=[proc])
    width = batch["input_ids"].shape[1]
    assert any(step is not None for step in proc.exit_steps)
    for b, prompt in enumerate(PROMPTS):
        solo_proc = rpdi(tokenizer)
        solo_in = tokenizer([prompt], return_tensors="pt")
        solo = model.generate(
            **solo_in, max_new_tokens=20, do_sample=False, logits_processor=[solo_proc]
        )
        assert out[b, width:].tolist() == solo[0, solo_in["input_ids"].shape[1] :].tolist()
        assert solo_proc.exit_steps == [proc.exit_steps[b]]


def test_processor_list_and_output_scores_show_the_forced_token(model, tokenizer):
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    proc = rpdi(tokenizer)
    out = model.generate(
        **batch,
        max_new_tokens=20,
        do_sample=False,
        logits_processor=LogitsProcessorList([proc]),
        return_dict_in_generate=True,
        output_scores=True,
    )
    end = tokenizer.convert_tokens_to_ids("</think>")
    for b, step in enumerate(proc.exit_steps):
        if step is None:
            continue
        scores = out.scores[step - 1][b]  # think step t is generated at decoding step t
        assert torch.isfinite(scores).sum() == 1
        assert scores.argmax() == end


def test_num_return_sequences_gets_one_state_per_sequence(model, tokenizer):
    batch = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    proc = rpdi(tokenizer)
    torch.manual_seed(0)
    out = model.generate(
        **batch, max_new_tokens=12, do_sample=True, num_return_sequences=3, logits_processor=[proc]
    )
    assert out.shape[0] == 6
    assert len(proc.exit_steps) == 6


def test_text_generation_pipeline_passes_the_processor(model, tokenizer):
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    proc = rpdi(tokenizer)
    kwargs = dict(max_new_tokens=12, do_sample=False, logits_processor=LogitsProcessorList([proc]))
    text = generator(PROMPTS[1], **kwargs)[0]["generated_text"]
    assert text.startswith(PROMPTS[1])  # the pipeline drops special tokens from the text
    ids = generator(PROMPTS[1], return_tensors=True, **kwargs)[0]["generated_token_ids"]
    assert proc.exit_steps[0] is not None
    assert tokenizer.convert_tokens_to_ids("</think>") in ids


def test_beam_search_is_refused_clearly(model, tokenizer):
    # refused when the beams reorder rows (a processor cannot see num_beams): 4 beams over 24
    # tokens reorder for every prompt here
    for prompt in PROMPTS:
        batch = tokenizer([prompt], return_tensors="pt")
        for proc in (rpdi(tokenizer), make_processor("budget", {"budget": 3}, model, tokenizer)):
            with pytest.raises(ValueError, match="beam search"):
                model.generate(**batch, max_new_tokens=24, num_beams=4, logits_processor=[proc])


def test_probing_baselines_need_the_kv_cache(model, tokenizer):
    batch = tokenizer(PROMPTS[:1], return_tensors="pt")
    proc = DynasorExitProcessor.from_tokenizer(model, tokenizer, interval=2)
    with proc, pytest.raises(ValueError, match="use_cache=True"):
        model.generate(
            **batch, max_new_tokens=8, do_sample=False, use_cache=False, logits_processor=[proc]
        )
