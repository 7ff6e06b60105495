"""Questions and answers as token ids for any transformers tokenizer, and the toy's word-level
tokenizer (issue 28, in progress).

:func:`encode_qa` builds right-padded rows ``question answer </s>`` with labels on the answer and
the end token only; :func:`answer_hits` scores a batch by exact match of the teacher-forced argmax
over every answer token (one word, one token for the toy's tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EncodedQA", "answer_hits", "encode_qa", "word_tokenizer"]

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def word_tokenizer(words):
    """A whitespace word-level ``PreTrainedTokenizerFast`` over ``words`` and the specials,
    prepending ``<s>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(dict.fromkeys((*SPECIALS, *words)))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")  # fmt: skip


@dataclass
class EncodedQA:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    """-100 except on the answer's tokens and the end token"""

    def rows(self, index) -> EncodedQA:
        return EncodedQA(self.input_ids[index], self.attention_mask[index], self.labels[index])


def encode_qa(tokenizer, questions: list[str], answers: list[str]) -> EncodedQA:
    """Right-padded ``question answer </s>`` rows."""
    if not questions or len(questions) != len(answers):
        raise ValueError(
            f"questions and answers must be non-empty and as many, got {len(questions)} and {len(answers)}"
        )
    rows, starts = [], []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for question, answer in zip(questions, answers, strict=True):
        prompt = tokenizer(question)["input_ids"]
        starts.append(len(prompt))
        rows.append(prompt + tokenizer(" " + answer, add_special_tokens=False)["input_ids"] + eos)
    length = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, start : len(row)] = ids[i, start : len(row)]
    return EncodedQA(ids, mask, labels)


def answer_hits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row: every labelled token is the argmax of the logits one position earlier."""
    predicted = logits[:, :-1].argmax(-1)
    target = labels[:, 1:]
    scored = target != -100
    return ((predicted == target) | ~scored).all(-1) & scored.any(-1)
