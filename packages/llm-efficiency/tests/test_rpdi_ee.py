"""RPDIExitProcessor on a tiny random Llama (explicit ids, no tokenizer, no network)."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList, TemperatureLogitsWarper

from mixlab.llm_efficiency.rpdi_ee import RPDIExitProcessor, token_entropy

torch.set_num_threads(1)

END, END3 = [257], [257, 258, 259]  # think-end ids: one token, three tokens
P = 6  # prompt length


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=260,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(8)  # peakier, more varied entropies than a flat random head
    m.generation_config.pad_token_id = 0
    m.generation_config.eos_token_id = None
    return m


@pytest.fixture(scope="module")
def prompts():
    return torch.randint(3, 257, (3, P), generator=torch.Generator().manual_seed(1))


def gen(model, x, proc=None, n=30, **kw):
    procs = [proc] if proc is not None else None
    return model.generate(x, max_new_tokens=n, do_sample=False, logits_processor=procs, **kw)


def recompute(h: list[float], w: int, variant: str) -> list[float]:
    """The index at every step, directly from the entropies (no running sums)."""
    out, ema = [], 0.0
    for t in range(1, len(h) + 1):
        gtf = sum(h[:t]) / t
        if variant == "window":
            out.append(sum(h[max(0, t - w) : t]) / min(t, w) / gtf)
        elif variant == "ema":
            ema = h[0] if t == 1 else 2 / (w + 1) * h[t - 1] + (1 - 2 / (w + 1)) * ema
            out.append(ema / gtf)
        else:
            flags = []
            for i in range(max(1, t - w + 1), t + 1):
                past = h[: i - 1]
                mu = sum(past) / len(past) if past else 0.0
                sd = (
                    math.sqrt(max(sum(v * v for v in past) / len(past) - mu * mu, 0.0))
                    if past
                    else 0.0
                )
                flags.append(i > 1 and h[i - 1] > mu + sd)
            out.append(sum(flags) / min(t, w))
    return out


@pytest.mark.parametrize("variant", ["window", "ema", "transitions"])
def test_running_index_equals_recomputation(model, prompts, variant):
    torch.manual_seed(3)
    proc = RPDIExitProcessor(END, window=5, threshold=math.inf, variant=variant)
    kw = dict(do_sample=True, return_dict_in_generate=True, output_logits=True)
    out = model.generate(prompts, max_new_tokens=40, logits_processor=[proc], **kw)
    raw = torch.stack(out.logits, 1)  # (B, steps, V): the model's logits, before any processor
    for b in range(len(prompts)):
        n = len(proc.entropies[b])  # a row that samples </think> itself stops there
        assert n == 40 or out.sequences[b, P + n - 1] == END[0]
        assert proc.entropies[b] == pytest.approx(token_entropy(raw[b, :n]).tolist(), abs=1e-6)
        assert proc.traces[b] == pytest.approx(
            recompute(proc.entropies[b], 5, variant), rel=1e-9, abs=1e-12
        )
    if variant == "transitions":
        assert all(0 <= v <= 1 for tr in proc.traces for v in tr)
        assert any(v > 0 for tr in proc.traces for v in tr)


def replay(model, seqs, n_prompt, **kw):
    """A fresh processor fed the sequence's untempered logits (teacher forcing, temperature 1)."""
    proc = RPDIExitProcessor(**kw)
    with torch.no_grad():
        logits = model(seqs).logits.float()
    for k in range(n_prompt, seqs.shape[1]):
        proc(seqs[:, :k], logits[:, k - 1])
    return proc


@pytest.mark.parametrize("temperature", [0.5, 1.7])
def test_exit_ignores_sampling_temperature(model, prompts, temperature):
    def sample(proc, procs=None):
        torch.manual_seed(7)
        procs = procs or [proc]
        kw = dict(do_sample=True, temperature=temperature, top_k=0, logits_processor=procs)
        return model.generate(prompts, max_new_tokens=30, **kw)

    probe = RPDIExitProcessor(END3, window=4, threshold=math.inf)
    sample(probe)
    kw = dict(
        think_end_ids=END3, window=4, threshold=max(max(tr[4:]) for tr in probe.traces) - 1e-4
    )
    proc = RPDIExitProcessor(**kw)
    seqs = sample(proc)
    assert any(s is not None for s in proc.exit_steps)
    ref = replay(model, seqs, P, **kw)
    assert ref.exit_steps == proc.exit_steps
    for b in range(len(prompts)):
        assert proc.traces[b] == pytest.approx(ref.traces[b], rel=1e-4)
    # the control: a temperature applied before the processor does change the entropies
    tempered = RPDIExitProcessor(**kw)
    sample(tempered, LogitsProcessorList([TemperatureLogitsWarper(temperature), tempered]))
    assert tempered.entropies[0][0] != pytest.approx(proc.entropies[0][0], rel=1e-3)


@pytest.mark.parametrize(("window", "min_steps"), [(3, 0), (3, 9), (7, 2), (1, 0)])
def test_no_exit_before_max_of_window_and_min_steps(model, prompts, window, min_steps):
    # lambda ~ 0: the index is above it at every step, so the exit fires as soon as it may
    proc = RPDIExitProcessor(END, window=window, threshold=1e-9, min_steps=min_steps)
    out = gen(model, prompts, proc)
    start = max(window, min_steps)
    assert proc.exit_steps == [start] * len(prompts)
    assert all(len(tr) == start for tr in proc.traces)
    assert (out[:, P + start - 1] == END[0]).all()


@pytest.mark.parametrize("end", [END, END3])
def test_forced_ids_are_the_think_end_ids(model, prompts, end):
    plain = gen(model, prompts)
    proc = RPDIExitProcessor(end, window=4, threshold=1e-9, min_steps=5)
    out = gen(model, prompts, proc)
    t = 5
    assert torch.equal(out[:, : P + t - 1], plain[:, : P + t - 1])  # untouched before the exit
    assert (out[:, P + t - 1 : P + t - 1 + len(end)] == torch.tensor(end)).all()
    assert all(len(tr) == t for tr in proc.traces)  # nothing computed after the exit


def test_exit_only_at_boundary_tokens(model, prompts):
    plain = gen(model, prompts[:1])[0, P:].tolist()
    w = 3
    boundary = {plain[w + 2]}  # a token the row emits at think step w + 3
    proc = RPDIExitProcessor(END, window=w, threshold=1e-9, check_at=boundary)
    out = gen(model, prompts[:1], proc)[0, P:].tolist()
    # step t may exit when the token emitted at step t - 1 is a boundary token
    expected = next(t for t in range(max(w, 2), len(plain) + 1) if plain[t - 2] in boundary)
    assert proc.exit_steps == [expected]
    assert out[expected - 2] in boundary
    assert out[expected - 1] == END[0]


def test_infinite_threshold_is_plain_generate_bit_for_bit(model, prompts):
    proc = RPDIExitProcessor(END3, window=2, threshold=math.inf)
    assert torch.equal(gen(model, prompts, proc), gen(model, prompts))
    assert proc.exit_steps == [None] * len(prompts)
    assert all(len(tr) == 30 for tr in proc.traces)


def test_batch_row_equals_solo_run_with_left_padding(model, prompts):
    lens = [6, 3, 5]
    batch = torch.zeros_like(prompts)
    mask = torch.zeros_like(prompts)
    for b, n in enumerate(lens):
        batch[b, P - n :], mask[b, P - n :] = prompts[b, :n], 1
    probe = RPDIExitProcessor(END3, window=3, threshold=math.inf)
    gen(model, batch, probe, attention_mask=mask)
    peaks = sorted(max(tr[3:]) for tr in probe.traces)
    kw = dict(think_end_ids=END3, window=3, threshold=(peaks[-1] + peaks[-2]) / 2)  # one row exits
    proc = RPDIExitProcessor(**kw)
    out = gen(model, batch, proc, attention_mask=mask)[:, P:]
    assert len({s for s in proc.exit_steps}) > 1  # rows exit at different steps (or not at all)
    for b, n in enumerate(lens):
        solo = RPDIExitProcessor(**kw)
        assert torch.equal(gen(model, prompts[b : b + 1, :n], solo)[0, n:], out[b])
        assert solo.exit_steps == [proc.exit_steps[b]]
        assert solo.traces[0] == pytest.approx(proc.traces[b], rel=1e-4)


def test_no_extra_model_calls(model, prompts):
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        gen(model, prompts, n=25)
        plain = len(calls)
        calls.clear()
        proc = RPDIExitProcessor(END3, window=3, threshold=1e-9)
        gen(model, prompts, proc, n=25)
    finally:
        hook.remove()
    assert proc.exit_steps == [3] * len(prompts)
    assert len(calls) == plain == 25


def test_beam_search_is_refused(model, prompts):
    with pytest.raises(ValueError, match="num_beams"):
        gen(model, prompts, RPDIExitProcessor(END, window=2, threshold=1.5), num_beams=2, n=8)


def test_reset_and_new_generate_call(model, prompts):
    proc = RPDIExitProcessor(END, window=3, threshold=1e-9)
    gen(model, prompts, proc)
    gen(model, prompts[:1], proc, n=10)  # a new call: detected, state restarts
    assert proc.exit_steps == [3]
    assert len(proc.traces[0]) == 3
    proc.reset()
    assert proc.exit_steps == []
    assert proc.traces == []


def test_entropy_treats_masked_tokens_as_zero_probability():
    scores = torch.tensor([[0.0, 0.0, -math.inf, -math.inf], [1.0, 1.0, 1.0, 1.0]])
    assert token_entropy(scores).tolist() == pytest.approx([math.log(2), math.log(4)])


def test_think_start_and_natural_end_and_eos():
    # direct calls: row 0 has <think> in the prompt, row 1 emits it later, row 2 never
    start, end, eos = 250, 251, 252
    proc = RPDIExitProcessor(
        [end], window=2, threshold=math.inf, think_start_id=start, eos_token_id=eos
    )
    ids = torch.tensor([[5, 6, start], [5, 6, 7], [5, 6, 7]])
    scores = torch.zeros(3, 260)
    for tokens in ([8, 8, 8], [9, start, 9], [end, 9, eos], [9, 9, 9]):
        proc(ids, scores)
        ids = torch.cat([ids, torch.tensor(tokens)[:, None]], 1)
    proc(ids, scores)
    # row 0 thinks steps 1-3 (its third think token is </think>); row 1 starts after <think>
    assert [len(t) for t in proc.traces] == [3, 3, 0]
    assert proc.entropies[0][0] == pytest.approx(math.log(260))


def test_bad_inputs():
    with pytest.raises(ValueError, match="window"):
        RPDIExitProcessor(END, window=0)
    with pytest.raises(ValueError, match="threshold"):
        RPDIExitProcessor(END, threshold=0.0)
    with pytest.raises(ValueError, match="threshold"):
        RPDIExitProcessor(END, threshold=float("nan"))
    with pytest.raises(ValueError, match="min_steps"):
        RPDIExitProcessor(END, min_steps=-1)
    with pytest.raises(ValueError, match="check_at"):
        RPDIExitProcessor(END, check_at="sentences")
    with pytest.raises(ValueError, match="check_at"):
        RPDIExitProcessor(END, check_at=[])
    with pytest.raises(ValueError, match="variant"):
        RPDIExitProcessor(END, variant="cusum")
    with pytest.raises(ValueError, match="think_end_ids"):
        RPDIExitProcessor([])
    with pytest.raises(ValueError, match="think_start_id"):
        RPDIExitProcessor(END, think_start_id=[1, 2])


def _tokenizer(with_think: bool):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, "a": 2, ".": 3, "<think>": 4}
    if with_think:
        vocab["</think>"] = 5
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def test_from_tokenizer():
    proc = RPDIExitProcessor.from_tokenizer(_tokenizer(True), check_at=["."], window=3)
    assert proc.think_end_ids == [5]
    assert proc.think_start_id == 4
    assert proc.check_at == {3}
    assert proc.eos_ids == {1}
    with pytest.raises(ValueError, match="think_end"):
        RPDIExitProcessor.from_tokenizer(_tokenizer(False))
    with pytest.raises(ValueError, match="think_start"):
        RPDIExitProcessor.from_tokenizer(_tokenizer(True), think_start="<reason>")
