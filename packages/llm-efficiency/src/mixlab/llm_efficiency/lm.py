"""The tiny-LM lab every LLM method of this package is measured on.

- Text: the Python standard library's own ``.py`` sources (no download), split BY FILE into
  train / val / test (file ``i`` of the sorted list: ``i % 10 == 0`` test, ``== 1`` val, else
  train); :func:`corpus_split` returns the bytes and a SHA-256 of the file list and contents, so a
  Python upgrade that changes the text changes the cache key instead of silently the data.
- Tokenizer: bytes (vocabulary 256), so any text file can be scored without a trained vocabulary.
- Model: a Hugging Face ``LlamaForCausalLM`` (:func:`llama_config`), trained with ``accelerate``
  by :func:`train_lm` (AdamW, warm-up + cosine; checkpoints every ``save_every`` steps and resumes
  after a kill), cached by config in the mixlab cache folder by :func:`pretrained_lm`.
- Evaluation: :func:`token_nll` (per-token negative log-likelihood) and :func:`perplexity` of any
  causal LM on any token stream; :func:`encode_file` tokenizes with the model folder's own
  tokenizer when it has one (a real Hugging Face model), else as bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mixlab.shared import (
    Checkpointer,
    cache_dir,
    capture_rng_state,
    progress,
    require,
    restore_rng_state,
    warmup_cosine,
)

__all__ = [
    "LMConfig",
    "corpus_split",
    "encode_file",
    "llama_config",
    "load_lm",
    "perplexity",
    "perplexity_of",
    "pretrained_lm",
    "token_nll",
    "train_lm",
]

MARKER = "mixlab_lm.json"  # written next to a model this lab trained: its config and tokenizer


@dataclass(frozen=True)
class LMConfig:
    """A tiny Llama and how it is trained (the defaults train in about a minute on 2 cores)."""

    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 384
    seq_len: int = 128
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    train_bytes: int = 2_000_000  # the first bytes of the train split that training draws from
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads", "intermediate_size", "seq_len", "steps"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
        require(self.hidden_size % self.heads == 0, "heads", "a divisor of hidden_size", self.heads)
        require(self.lr > 0, "lr", "a positive number", self.lr)
        require(
            self.train_bytes > self.seq_len, "train_bytes", "more than seq_len", self.train_bytes
        )

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files (tests, site-packages and idlelib excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def corpus_split() -> tuple[dict[str, torch.Tensor], str]:
    """``({"train", "val", "test"}: uint8 token tensors, sha256)`` of the stdlib corpus."""
    files = stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[bytes]] = {"train": [], "val": [], "test": []}
    digest = hashlib.sha256()
    for i, path in enumerate(files):
        text = path.read_bytes()
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + text)
        split = "test" if i % 10 == 0 else "val" if i % 10 == 1 else "train"
        parts[split].append(text + b"\n\n")
    tokens = {
        name: torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
        for name, chunks in parts.items()
    }
    return tokens, digest.hexdigest()


def llama_config(config: LMConfig) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=config.seq_len,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def _batch(
    tokens: torch.Tensor, seq_len: int, size: int, generator: torch.Generator
) -> torch.Tensor:
    starts = torch.randint(len(tokens) - seq_len - 1, (size,), generator=generator)
    return torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()]).long()


def train_lm(config: LMConfig, out_dir: str | Path, *, resume: bool = True) -> Path:
    """Train the tiny Llama on the stdlib train split and save it (``save_pretrained``) to
    ``out_dir``; checkpoints go to ``out_dir/checkpoints`` every 50 steps and a killed run
    resumes there."""
    from accelerate import Accelerator
    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    splits, digest = corpus_split()
    train = splits["train"][: config.train_bytes]
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(llama_config(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.1)
    schedule = warmup_cosine(optimizer, config.steps)
    generator = torch.Generator().manual_seed(config.seed)
    checkpoints = Checkpointer(out_dir, resume=resume, keep_last=1)
    start = 0
    if (last := checkpoints.load_latest()) is not None:
        start, state = last
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["batches"])
        restore_rng_state(state["rng"])
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    with progress(config.steps, "training the tiny LM", completed=start) as bar:
        for step in range(start, config.steps):
            batch = _batch(train, config.seq_len, config.batch_size, generator).to(
                accelerator.device
            )
            logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            bar.advance(loss=loss.item())
            if (step + 1) % 50 == 0 and step + 1 < config.steps:
                state = {
                    "model": accelerator.unwrap_model(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "batches": generator.get_state(),
                    "rng": capture_rng_state(),
                }
                checkpoints.save(step + 1, state)
    model = accelerator.unwrap_model(model).eval()
    model.save_pretrained(out_dir)
    marker = {"tokenizer": "bytes", "config": asdict(config), "corpus_sha256": digest}
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2))
    shutil.rmtree(checkpoints.directory, ignore_errors=True)
    return out_dir


def pretrained_lm(config: LMConfig = LMConfig(), device: torch.device | str = "cpu") -> Any:
    """The tiny Llama of ``config``, from the cache when there (seconds), else trained now (and
    resumed from its checkpoints if an earlier training was killed)."""
    folder = cache_dir("llm_efficiency", f"tiny-llama-{config.key()}")
    if not (folder / MARKER).exists():
        train_lm(config, folder, resume=True)
    return load_lm(folder, device)


def load_lm(path: str | Path, device: torch.device | str = "cpu") -> Any:
    """A causal LM from a local folder (never the hub), in eval mode."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise ValueError(f"--model: {path} is not a model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.to(device).eval()


def encode_file(model_dir: str | Path, text_file: str | Path) -> torch.Tensor:
    """Token ids of ``text_file``: bytes for a model of this lab, else the model's tokenizer."""
    text_file, model_dir = Path(text_file), Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model: {model_dir} is not a model folder (no config.json)")
    if not text_file.is_file():
        raise ValueError(f"--text: {text_file} is not a file")
    if (model_dir / MARKER).exists() or not any(model_dir.glob("tokenizer*")):
        vocab = json.loads((model_dir / "config.json").read_text()).get("vocab_size", 256)
        if vocab < 256:
            raise ValueError(
                f"--model: {model_dir} has no tokenizer files and a vocabulary of {vocab} < 256, "
                "so its text cannot be read as bytes"
            )
        return torch.frombuffer(bytearray(text_file.read_bytes()), dtype=torch.uint8).long()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return torch.tensor(tokenizer(text_file.read_text())["input_ids"])


@torch.no_grad()
def token_nll(
    model: Any,
    tokens: torch.Tensor,
    seq_len: int,
    *,
    batch_size: int = 16,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Negative log-likelihood of every predicted token, scoring ``tokens`` in non-overlapping
    windows of ``seq_len + 1`` (the first token of each window is context only)."""
    require(isinstance(seq_len, int) and seq_len >= 1, "seq_len", "an integer >= 1", seq_len)
    tokens = tokens.long().flatten()
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    windows = (len(tokens) - 1) // seq_len
    if windows < 1:
        raise ValueError(
            f"the text has {len(tokens)} tokens: at least seq_len + 1 = {seq_len + 1} needed"
        )
    device = next(model.parameters()).device
    inputs = tokens[: windows * seq_len].view(windows, seq_len)
    targets = tokens[1 : windows * seq_len + 1].view(windows, seq_len)
    losses = []
    for start in range(0, windows, batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        logits = model(input_ids=x).logits.float()
        losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").cpu())
    return torch.cat(losses)


def perplexity(model: Any, tokens: torch.Tensor, seq_len: int, **kwargs: Any) -> float:
    """exp(mean token NLL) of ``tokens`` (see :func:`token_nll`)."""
    return perplexity_of(token_nll(model, tokens, seq_len, **kwargs))


def perplexity_of(nll: torch.Tensor) -> float:
    """exp(mean) of per-token negative log-likelihoods."""
    return math.exp(nll.mean().item())
