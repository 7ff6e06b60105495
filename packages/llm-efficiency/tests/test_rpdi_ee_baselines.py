"""The early-exit baselines (fixed budget, DEER-, Dynasor-, EAT-style) and the runner that
measures every method the same way, on a tiny random Llama (no network)."""

import pytest
import torch
from transformers import LlamaForCausalLM, LogitsProcessor

from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer
from mixlab.llm_efficiency.rpdi_ee import (
    DEERExitProcessor,
    DynasorExitProcessor,
    EATExitProcessor,
    FixedBudgetProcessor,
    generate_all,
    make_processor,
)

torch.set_num_threads(1)

END = [259]  # </think>
PROMPT_LEN = 9


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LMConfig(hidden_size=32, layers=2, heads=2, intermediate_size=64)
    m = LlamaForCausalLM(llama_config(config, vocab_size=260, eos_token_id=257, pad_token_id=256))
    with torch.no_grad():
        m.lm_head.weight.mul_(6)
        m.lm_head.weight[257].zero_()  # never ends on its own: exits are the processors'
        m.lm_head.weight[259].zero_()
    return m.eval()


@pytest.fixture(scope="module")
def padded():
    """Three left-padded prompts of 9, 6 and 4 tokens."""
    ids = torch.randint(0, 256, (3, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    return ids.masked_fill(mask == 0, 256), mask


def gen(model, padded, procs, n=24):
    ids, mask = padded
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=n,
        do_sample=False,
        logits_processor=procs,
        pad_token_id=256,
    )


class ProbeChecker(DynasorExitProcessor):
    """Compares every probe against recomputing the whole (unpadded, cut) prefix."""

    def __init__(self, *args, mask, drop, **kwargs):
        super().__init__(*args, **kwargs)
        self.mask, self.drop, self.gaps = mask, drop, []

    def _decide(self, active, input_ids, scores):
        rows = [b for b in active if self._rows[b].t % self.interval == 0]
        if not rows:
            return []
        drop = [self.drop] * len(rows)
        _, _, logp = self._probe(rows, drop)
        for i, b in enumerate(rows):
            real = self.mask[b].bool().tolist() + [True] * (input_ids.shape[1] - PROMPT_LEN)
            ids = [t for t, keep in zip(input_ids[b].tolist(), real, strict=True) if keep]
            ids = ids[: len(ids) - self.drop] + self.answer_prompt_ids
            with torch.no_grad():
                ref = self.model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            self.gaps.append(float((ref - logp[i]).abs().max()))
        return []


@pytest.mark.parametrize("drop", [0, 2])
def test_probe_on_the_copied_cache_equals_recomputing_the_prefix(model, padded, drop):
    proc = ProbeChecker(
        model, END, interval=4, answer_prompt_ids=[259, 32], mask=padded[1], drop=drop
    )
    with proc:
        gen(model, padded, [proc], n=13)
    assert len(proc.gaps) == 9  # 3 probes per row
    assert max(proc.gaps) < 1e-4
    assert proc.probe_tokens == [6, 6, 6]  # 2 prompt tokens per probe, one answer token


def test_probes_leave_generation_untouched(model, padded):
    plain = gen(model, padded, None)
    never = DEERExitProcessor(model, END, transition_ids=[[32]], threshold=1.0)  # conf > 1: never
    dyn = DynasorExitProcessor(model, END, interval=3, agree=100, answer_tokens=3)
    with never, dyn:
        assert torch.equal(gen(model, padded, [never, dyn]), plain)
    assert dyn.probe_tokens == [8 * 3] * 3  # 8 probes x (1 prompt + 3 answer - 1)
    assert dyn.exit_steps == [None] * 3


def test_close_removes_the_hook(model):
    before = len(model._forward_pre_hooks)
    proc = EATExitProcessor(model, END)
    assert len(model._forward_pre_hooks) == before + 1
    proc.close()
    assert len(model._forward_pre_hooks) == before


@pytest.mark.parametrize("budget", [1, 5])
def test_fixed_budget_forces_the_end_after_budget_tokens(model, padded, budget):
    proc = FixedBudgetProcessor(END, budget)
    out = gen(model, padded, [proc])
    assert proc.exit_steps == [budget + 1] * 3
    assert (out[:, PROMPT_LEN + budget] == END[0]).all()
    assert proc.probe_tokens == [0, 0, 0]


def test_dynasor_exits_after_k_agreeing_probes(model, padded):
    with DynasorExitProcessor(model, END, interval=4, agree=1) as proc:
        out = gen(model, padded, [proc])
    assert proc.exit_steps == [4, 4, 4]  # one probe is enough with k = 1
    assert (out[:, PROMPT_LEN + 3] == END[0]).all()
    assert proc.probe_tokens == [1, 1, 1]


def test_eat_exits_once_the_variance_is_below_delta(model, padded):
    with EATExitProcessor(model, END, interval=3, threshold=1e9, min_probes=2) as proc:
        gen(model, padded, [proc])
    assert proc.exit_steps == [6, 6, 6]  # the second probe (t = 6) may exit
    with EATExitProcessor(model, END, interval=3, threshold=1e-30, min_probes=2) as never:
        gen(model, padded, [never])
    assert never.exit_steps == [None] * 3


class ForceAt(LogitsProcessor):
    """Forces ``token`` at generation step ``step`` in every row."""

    def __init__(self, step: int, token: int):
        self.step, self.token, self.calls = step, token, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.step:
            scores = torch.full_like(scores, -float("inf"))
            scores[:, self.token] = 0
        return scores


def test_deer_probes_only_after_a_transition_word(model, padded):
    with DEERExitProcessor(model, END, transition_ids=[[7]], threshold=1e-9) as proc:
        out = gen(model, padded, [ForceAt(5, 7), proc])
    assert (out[:, PROMPT_LEN + 4] == 7).all()  # the transition word, written at step 5
    assert proc.exit_steps == [6, 6, 6]  # probed at the next step, confident: exit
    assert (out[:, PROMPT_LEN + 5] == END[0]).all()
    assert proc.probe_tokens == [1, 1, 1]


def test_make_processor_and_its_refusals(model):
    tokenizer = reasoning_tokenizer()
    assert make_processor("vanilla", {}, model, tokenizer) is None
    proc = make_processor("rpdi", {"window": 4, "check_at": ["."]}, model, tokenizer)
    assert proc.check_at == frozenset({ord(".")})
    assert proc.think_end_ids == END
    deer = make_processor("deer", {}, model, tokenizer, transitions=("wait ", "hmm "))
    assert deer.transition_ids == [list(b"wait "), list(b"hmm ")]
    deer.close()
    with pytest.raises(ValueError, match="method must be one of"):
        make_processor("magic", {}, model, tokenizer)
    with pytest.raises(ValueError, match="rpdi takes the parameters"):
        make_processor("rpdi", {"budget": 3}, model, tokenizer)
    with pytest.raises(ValueError, match="budget needs"):
        make_processor("budget", {}, model, tokenizer)
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        FixedBudgetProcessor(END, 0)
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, length >= 1\]"):
        FixedBudgetProcessor(END, 3)(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 9))
    with pytest.raises(ValueError, match="threshold must be a number in"):
        DEERExitProcessor(model, END, transition_ids=[[1]], threshold=1.5).close()
    with pytest.raises(ValueError, match="transition_ids"):
        DEERExitProcessor(model, END, transition_ids=[]).close()
    with pytest.raises(ValueError, match="model must be"):
        DynasorExitProcessor("not a model", END)


def test_generate_all_counts_think_and_forward_tokens(model):
    tokenizer = reasoning_tokenizer()
    prompts = ["1 +2 x3 = <think>", "3 *2 x4 = <think>", "7 -3 x5 = <think>"]
    rows = generate_all(
        model,
        tokenizer,
        prompts,
        lambda: make_processor("budget", {"budget": 5}, model, tokenizer),
        batch_size=2,
        max_new_tokens=12,
        temperature=0,
    )
    assert [r["think_tokens"] for r in rows] == [5, 5, 5]
    assert [r["exit_step"] for r in rows] == [6, 6, 6]
    assert all("</think>" in r["text"] for r in rows)
    assert all(r["generated_tokens"] == r["forward_tokens"] == 12 for r in rows)
    sampled = [
        generate_all(model, tokenizer, prompts, lambda: None, seed=3, max_new_tokens=8)
        for _ in range(2)
    ]
    assert [r["text"] for r in sampled[0]] == [r["text"] for r in sampled[1]]  # seeded
    assert tokenizer.padding_side == "left"
    with pytest.raises(ValueError, match="temperature"):
        generate_all(model, tokenizer, prompts, lambda: None, temperature=-1)
