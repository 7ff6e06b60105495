"""The reasoning toy: its tokenizer, its traces (format, arithmetic, rates) and packing."""

from __future__ import annotations

import math
import re

import pytest
import torch

from mixlab.llm_efficiency.lm import MARKER, LMConfig, encode_file, load_lm
from mixlab.llm_efficiency.reasoning import (
    EOS,
    THINK,
    THINK_END,
    Problem,
    ReasoningLMConfig,
    Trace,
    TraceConfig,
    generate_traces,
    pack_traces,
    parse_answer,
    problems,
    reasoning_tokenizer,
    train_reasoning_lm,
)
from mixlab.shared import Checkpointer

CONFIG = TraceConfig()
ITEM = re.compile(r"(\d)\.|(\d+):(\d)\.|answer=(\d)\.|([a-z]+) ")


@pytest.fixture(scope="module")
def tokenizer():
    return reasoning_tokenizer()


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return generate_traces(2000, seed=0, config=CONFIG)


def apply(value: int, op: str, operand: int) -> int:
    return {"+": value + operand, "-": value - operand, "*": value * operand}[op] % 10


# ------------------------------------------------------------------------------------------------
# tokenizer


def test_tokenizer_ids_are_bytes_then_four_specials(tokenizer):
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<eos>", "<think>", "</think>"]) == [
        256,
        257,
        258,
        259,
    ]
    assert len(tokenizer) == 260
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (256, 257)
    assert tokenizer("</think>", add_special_tokens=False)["input_ids"] == [259]
    text = "6 a+5 b*8 =\n\tx ~!é日本🙂"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == list(text.encode())
    assert tokenizer(text)["input_ids"] == [257, *text.encode()]  # <eos> is the BOS
    assert tokenizer.bos_token_id == 257


@pytest.mark.parametrize(
    "text",
    ["", " ", "  a  b ", "x\r\ny\n", "é 日本 🙂", "<think>1.1:3.</think> 3<eos>", "<pad><eos>"],
)
def test_tokenizer_round_trips_text(tokenizer, text):
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == EOS + text


def test_tokenizer_save_and_load_round_trip(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "3 +2 x1 = <think>3.1:5.answer=5.</think> 5<eos>"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == EOS + text
    assert loaded.bos_token_id == 257
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (256, 257, "left")


def test_tokenizer_padding_side():
    left = reasoning_tokenizer()(["ab", "abcd"], padding=True)["input_ids"]
    right = reasoning_tokenizer("right")(["ab", "abcd"], padding=True)["input_ids"]
    assert left[0] == [256, 256, 257, 97, 98]
    assert right[0] == [257, 97, 98, 256, 256]
    with pytest.raises(ValueError, match="padding_side"):
        reasoning_tokenizer("middle")


# ------------------------------------------------------------------------------------------------
# traces


def test_traces_are_deterministic_under_a_seed():
    assert generate_traces(50, seed=3) == generate_traces(50, seed=3)
    assert generate_traces(50, seed=3) != generate_traces(50, seed=4)


def check_trace(trace: Trace) -> dict[str, int]:
    """Parse one trace, assert its format, arithmetic and records; return counts of its parts."""
    problem = trace.problem
    head = f"{problem.prompt} {THINK}"
    assert trace.text.startswith(head)
    assert trace.text.endswith(f"{THINK_END} {trace.final_answer}{EOS}")
    scratch = trace.text[len(head) : trace.text.index(THINK_END)]
    counts = dict.fromkeys(["main", "main_errors", "corrections", "over", "over_errors"], 0)
    stated, value, step_index, in_overthinking, last_step = None, problem.start, 0, False, None
    errors, position = [], 0
    for match in ITEM.finditer(scratch):
        assert match.start() == position, f"unparsed text in {scratch!r}"
        position = match.end()
        at = len(head) + match.start()
        start, step, result, answer, word = match.groups()
        if start is not None:  # each derivation restates the start
            assert int(start) == problem.start
            assert step_index == 0
            continue
        if word is not None:  # a transition: a correction (main line) or an overthinking round
            if stated is None:
                assert word == "wait"
                assert last_step is not None
                assert last_step[1], "a correction follows a wrong step"
                counts["corrections"] += 1
                step_index -= 1  # the corrected step comes again
                value = last_step[0]
            else:
                assert word in CONFIG.transitions
                in_overthinking, value, step_index = True, problem.start, 0
            continue
        if answer is not None:
            assert step_index == problem.steps
            stated = int(answer)
            assert stated == value
            continue
        assert int(step) == step_index + 1
        wrong = int(result) != apply(value, problem.op, problem.operand)
        if wrong:
            errors.append(at)
        part = "over" if in_overthinking else "main"
        counts[part] += 1
        counts[f"{part}_errors"] += wrong
        last_step = (value, wrong)
        value, step_index = int(result), step_index + 1
    assert position == len(scratch)
    assert tuple(errors) == trace.error_chars  # every wrong step is an injected one, and back
    assert stated == trace.final_answer  # the last stated answer is the one after </think>
    # a correction does not count as a main-line step of its own
    counts["main"] -= counts["corrections"]
    counts["main_errors"] -= counts["corrections"]
    return counts


def test_scratchpad_arithmetic_is_right_except_injected_errors(traces):
    for trace in traces:
        check_trace(trace)
        assert trace.answer == trace.problem.answer


def test_first_answer_index_points_at_the_first_answer(traces, tokenizer):
    for trace in traces:
        text = trace.text
        assert trace.first_answer_char == text.index("answer=")
        assert text[trace.first_answer_char : trace.exit_char] == f"answer={trace.first_answer}."
    for trace in traces[:50]:
        ids = tokenizer(trace.text, add_special_tokens=False)["input_ids"]
        assert len(
            tokenizer(trace.text[: trace.first_answer_char], add_special_tokens=False)["input_ids"]
        ) == (trace.first_answer_token)
        assert tokenizer.decode(ids[: trace.exit_token]) == trace.text[: trace.exit_char]


def test_recorded_flags_match_the_text(traces):
    for trace in traces:
        counts = check_trace(trace)
        assert trace.productive_wait == (counts["corrections"] > 0)
        after = trace.text[trace.exit_char : trace.text.index(THINK_END)]
        assert trace.rounds == sum(after.count(f"{word} ") for word in CONFIG.transitions)
        assert trace.rounds <= CONFIG.max_rounds
        assert not (trace.cut and trace.rounds == 0)


def within(observed: float, p: float, n: int) -> bool:
    return abs(observed - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_probabilities_match_observed_rates(traces):
    total = dict.fromkeys(["main", "main_errors", "corrections", "over", "over_errors"], 0)
    for trace in traces:
        for name, count in check_trace(trace).items():
            total[name] += count
    assert within(total["main_errors"] / total["main"], CONFIG.p_step_error, total["main"])
    assert within(total["corrections"] / total["main"], CONFIG.p_correction, total["main"])
    assert within(total["over_errors"] / total["over"], CONFIG.p_overthink_error, total["over"])
    n = len(traces)
    overthinking = [t for t in traces if t.rounds > 0]
    assert within(len(overthinking) / n, CONFIG.p_overthink, n)
    cut = sum(t.cut for t in overthinking) / len(overthinking)
    assert within(cut, CONFIG.p_cut, len(overthinking))
    uncut = [t for t in traces if not t.cut and t.rounds > 0]
    again = sum(t.rounds > 1 for t in uncut) / len(uncut)
    assert within(again, CONFIG.p_overthink, len(uncut))  # another round after each answer
    lengths = {t.problem.steps for t in traces}
    assert lengths == set(range(CONFIG.min_steps, CONFIG.max_steps + 1))


def test_extreme_probabilities():
    clean = TraceConfig(p_step_error=0, p_correction=0, p_overthink=0, p_overthink_error=0)
    for trace in generate_traces(100, seed=1, config=clean):
        assert trace.first_answer == trace.final_answer == trace.answer
        assert (trace.rounds, trace.cut, trace.productive_wait, trace.error_chars) == (
            0,
            False,
            False,
            (),
        )
        assert trace.exit_char == trace.text.index(THINK_END)
    always = TraceConfig(p_overthink=1, max_rounds=2, p_cut=0, p_correction=1, p_step_error=0)
    for trace in generate_traces(100, seed=1, config=always):
        assert trace.rounds == 2
        assert trace.productive_wait
        assert trace.first_answer == trace.answer


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_steps", 0),
        ("min_steps", 2.0),
        ("max_steps", 2),
        ("max_steps", 100),
        ("p_step_error", -0.1),
        ("p_correction", 1.5),
        ("p_overthink", float("nan")),
        ("p_overthink_error", True),
        ("p_cut", "0.2"),
        ("max_rounds", -1),
        ("transitions", ()),
        ("transitions", ["wait"]),
        ("transitions", ("Wait",)),
    ],
)
def test_bad_config_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        TraceConfig(**{field: value})


def test_step_error_and_correction_cannot_exceed_one():
    with pytest.raises(ValueError, match="p_correction"):
        TraceConfig(p_step_error=0.6, p_correction=0.6)


# ------------------------------------------------------------------------------------------------
# evaluation problems and answers


def test_problems_are_seeded_and_answered():
    batch = problems(200, seed=5)
    assert batch == problems(200, seed=5)
    assert batch != problems(200, seed=6)
    for problem in batch:
        assert re.fullmatch(r"\d [-+*]\d x[3-8] =", problem.prompt)
        assert problem.model_input == f"{problem.prompt} {THINK}"
        value = problem.start
        for _ in range(problem.steps):
            value = apply(value, problem.op, problem.operand)
        assert problem.answer == value
    assert Problem(6, "+", 7, 3).prompt == "6 +7 x3 ="
    assert Problem(6, "+", 7, 3).answer == 7
    assert Problem(6, "*", 7, 2).answer == 4
    assert {p.steps for p in problems(50, seed=0, min_steps=4, max_steps=4)} == {4}
    with pytest.raises(ValueError, match="max_steps"):
        problems(5, seed=0, max_steps=100)
    with pytest.raises(ValueError, match="^n must be"):
        problems(-1, seed=0)


@pytest.mark.parametrize(
    ("text", "answer"), [(" 7<eos>", 7), ("3", 3), ("\n 0 trailing", 0), ("", None), (" x7", None)]
)
def test_parse_answer(text, answer):
    assert parse_answer(text) == answer


# ------------------------------------------------------------------------------------------------
# training data


def test_pack_traces_cuts_the_token_stream_into_blocks(tokenizer):
    traces = generate_traces(40, seed=2)
    blocks = pack_traces(traces, tokenizer, seq_len=65)
    stream = [i for t in traces for i in tokenizer(t.text, add_special_tokens=False)["input_ids"]]
    assert blocks.dtype == torch.long
    assert blocks.shape == (len(stream) // 65, 65)
    assert blocks.flatten().tolist() == stream[: blocks.numel()]
    assert (blocks == tokenizer.eos_token_id).sum() >= len(traces) - 2  # a trace per <eos>
    with pytest.raises(ValueError, match="seq_len"):
        pack_traces(traces[:1], tokenizer, seq_len=10_000)
    with pytest.raises(ValueError, match="^seq_len must be"):
        pack_traces(traces, tokenizer, seq_len=0)


# ------------------------------------------------------------------------------------------------
# the reasoning LM (a tiny config: the real one is trained once by the experiment and cached)

TINY_LM = ReasoningLMConfig(
    lm=LMConfig(hidden_size=16, layers=1, heads=2, intermediate_size=32, seq_len=32, steps=51,
                batch_size=2, lr=1e-2, train_bytes=64),
    n_traces=40,
)  # fmt: skip


def test_reasoning_lm_trains_saves_its_tokenizer_and_resumes(tmp_path, monkeypatch):
    model = train_reasoning_lm(TINY_LM, tmp_path / "a")
    folder = tmp_path / "a"
    assert (folder / MARKER).is_file()
    assert not (folder / "checkpoints").exists()
    loaded = load_lm(folder)
    assert loaded.config.vocab_size == 260
    assert (loaded.config.eos_token_id, loaded.config.pad_token_id) == (257, 256)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    # the folder's own tokenizer reads text with special tokens as single ids
    text = tmp_path / "t.txt"
    text.write_text("1 +2 x1 = <think>1.1:3.answer=3.</think> 3")
    ids = encode_file(folder, text)
    assert ids[ids >= 256].tolist() == [257, 258, 259]  # the BOS <eos>, then the text's own
    # a run killed right after its checkpoint at step 50 resumes to the same weights
    save = Checkpointer.save

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        raise RuntimeError("killed")

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(RuntimeError, match="killed"):
        train_reasoning_lm(TINY_LM, tmp_path / "b")
    monkeypatch.setattr(Checkpointer, "save", save)
    assert not (tmp_path / "b" / MARKER).exists()
    resumed = train_reasoning_lm(TINY_LM, tmp_path / "b")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def test_reasoning_lm_config_is_validated():
    with pytest.raises(ValueError, match="^n_traces must be"):
        ReasoningLMConfig(n_traces=0)
    with pytest.raises(ValueError, match="^lm must be"):
        ReasoningLMConfig(lm={"hidden_size": 8})
