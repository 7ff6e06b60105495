"""The tiny-LM lab every LLM method of this package is measured on.

- Text: the Python standard library's own ``.py`` sources (no download), split BY FILE into
  train / val / test (file ``i`` of the sorted list: ``i % 10 == 0`` test, ``== 1`` val, else
  train); :func:`corpus_split` returns the bytes and a SHA-256 of the file list and contents, so a
  Python upgrade that changes the text changes the cache key instead of silently the data.
- Tokenizer: bytes (vocabulary 256), so any text file can be scored without a trained vocabulary.
- Model: a Hugging Face ``LlamaForCausalLM`` (:func:`llama_config`), trained with ``accelerate``
  by :func:`train_lm` (AdamW, warm-up + cosine; checkpoints every ``save_every`` steps and resumes
  after a kill); :func:`pretrained_lm` trains it once into the mixlab cache
  (:func:`mixlab.shared.cache.cached`, keyed by its config, the corpus digest and the source of
  the code that trains it: :data:`LM_CODE`).
- Evaluation: :func:`token_nll` (per-token negative log-likelihood) and :func:`perplexity` of any
  causal LM on any token stream; :func:`encode_file` tokenizes with the model folder's own
  tokenizer when it has one (a real Hugging Face model), else as bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import numbers
import shutil
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mixlab.shared import (
    Checkpointer,
    capture_rng_state,
    progress,
    require,
    restore_rng_state,
    warmup_cosine,
)
from mixlab.shared.cache import cached
from mixlab.shared.files import (
    CheckpointError,
    checkpoint_errors,
    read_sidecar,
    write_sidecar,
)

__all__ = [
    "LM_CODE",
    "LMConfig",
    "cached_lm_folder",
    "check_model_folder",
    "corpus_split",
    "decoder_blocks",
    "encode_file",
    "fit_lm",
    "llama_config",
    "load_cached_lm",
    "load_generator",
    "load_lm",
    "perplexity",
    "perplexity_of",
    "pretrained_lm",
    "text_encoder",
    "tiny_lm_folder",
    "token_nll",
    "train_lm",
]

MARKER = "mixlab_lm.json"
"""written last next to a model this lab trained: its config, tokenizer and the SHA-256 of the
model's files (a sidecar, :func:`mixlab.shared.files.write_sidecar`)"""
_MARKER_TYPES = {"tokenizer": str, "config": dict, "corpus_sha256": str}
LM_CODE = ("mixlab.llm_efficiency.lm", "mixlab.shared.optim")
"""the modules whose source trains every cached model of this package (the Llama config, the
training loop of :func:`fit_lm`, its learning-rate schedule): part of each cache key"""


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
        for name in (
            "hidden_size",
            "layers",
            "heads",
            "intermediate_size",
            "seq_len",
            "steps",
            "batch_size",
            "train_bytes",
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                name,
                "an integer >= 1",
                value,
            )
        require(self.hidden_size % self.heads == 0, "heads", "a divisor of hidden_size", self.heads)
        require(
            isinstance(self.lr, numbers.Real) and math.isfinite(self.lr) and self.lr > 0,
            "lr",
            "a finite number > 0",
            self.lr,
        )
        require(
            isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0,
            "seed",
            "an integer >= 0",
            self.seed,
        )
        require(
            self.train_bytes > self.seq_len, "train_bytes", "more than seq_len", self.train_bytes
        )

    def resized(self, hidden_size: int, layers: int, steps: int) -> LMConfig:
        """This config at another width, depth and step count: one attention head per 32
        channels and an MLP three times as wide, as the experiments' profiles scale it."""
        return replace(
            self,
            hidden_size=hidden_size,
            layers=layers,
            heads=hidden_size // 32,
            intermediate_size=3 * hidden_size,
            steps=steps,
        )


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


def llama_config(
    config: LMConfig,
    *,
    vocab_size: int = 256,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """The ``LlamaConfig`` of ``config``: bytes by default, a larger vocabulary (bytes plus
    special tokens) for labs such as :mod:`.reasoning`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=config.seq_len,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
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
    splits, digest = corpus_split()
    train = splits["train"][: config.train_bytes]
    fit_lm(
        config,
        llama_config(config),
        lambda generator: _batch(train, config.seq_len, config.batch_size, generator),
        out_dir,
        marker={"tokenizer": "bytes", "config": asdict(config), "corpus_sha256": digest},
        resume=resume,
        what="training the tiny LM",
    )
    return Path(out_dir)


def fit_lm(
    config: LMConfig,
    model_config: Any,
    draw_batch: Callable[[torch.Generator], torch.Tensor],
    out_dir: str | Path,
    *,
    marker: dict[str, Any],
    resume: bool = True,
    what: str = "training a tiny LM",
) -> Any:
    """Train a ``LlamaForCausalLM(model_config)`` on next-token prediction and save it to
    ``out_dir`` with ``marker`` (a sidecar over the saved files, written last): ``config.steps``
    AdamW steps (warm-up + cosine to ``config.lr``) on ``draw_batch(generator)``, a LongTensor
    ``[batch, seq_len + 1]`` or a pair ``(ids, targets)`` of them whose targets are -100 where a
    token is not predicted. Checkpoints every 50 steps in ``out_dir/checkpoints``; a killed run
    resumes there. Returns the trained model in eval mode."""
    from accelerate import Accelerator
    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    (out_dir / MARKER).unlink(missing_ok=True)  # a folder with a marker holds a finished model
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config)
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
    with progress(config.steps, what, completed=start) as bar:
        for step in range(start, config.steps):
            batch = draw_batch(generator)
            # a pair (ids, targets): targets of -100 (prompt tokens) carry no loss
            batch, targets = batch if isinstance(batch, tuple) else (batch, batch)
            batch, targets = batch.to(accelerator.device), targets.to(accelerator.device)
            logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets[:, 1:].flatten())
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
    write_sidecar(out_dir / MARKER, marker, covers=_model_files(out_dir))
    shutil.rmtree(checkpoints.directory, ignore_errors=True)
    return model


def _model_files(folder: Path) -> list[Path]:
    """The files of a saved model that its marker covers (weights and JSON configs)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.name != MARKER and p.suffix in (".safetensors", ".json")
    )


def cached_lm_folder(
    name: str,
    key: Mapping[str, Any],
    build: Callable[[Path], Any],
    *,
    code: Iterable[str] = (),
) -> Path:
    """The folder of the cached model ``name`` for ``key`` (what shapes it: its configs, a
    digest of its data), trained there first by ``build(folder)`` when absent. The key covers
    the source of :data:`LM_CODE` and of ``code`` (the modules that make its data), so a change
    to the code that trains a model trains it again (:func:`mixlab.shared.cache.cached`). The
    build is resumable: a training killed part-way resumes from its last checkpoint (every 50
    steps, in the folder it trains in) in the next run."""
    return cached("llm_efficiency", name, key, build, code=[*LM_CODE, *code], resumable=True)


def load_cached_lm(folder: Path, device: torch.device | str = "cpu", what: str = "model") -> Any:
    """:func:`load_lm` of a cache entry; a damaged one raises :class:`CheckpointError` naming
    the folder to delete."""
    try:
        return load_lm(folder, device)
    except CheckpointError as error:
        raise CheckpointError(
            f"{error}; the cached {what} is damaged: delete {folder} to train it again"
        ) from error


def tiny_lm_folder(config: LMConfig = LMConfig()) -> Path:
    """The cache folder of the tiny Llama of ``config`` (cache entry ``tiny-llama``, keyed by
    the config and the corpus digest), trained there first when absent."""
    _, corpus_sha256 = corpus_split()
    return cached_lm_folder(
        "tiny-llama",
        {**asdict(config), "corpus_sha256": corpus_sha256},
        lambda folder: train_lm(config, folder, resume=True),
    )


def pretrained_lm(config: LMConfig = LMConfig(), device: torch.device | str = "cpu") -> Any:
    """The tiny Llama of ``config``, from the cache when there (seconds), else trained now
    (:func:`tiny_lm_folder`). A damaged cached model raises :class:`CheckpointError` naming the
    folder to delete."""
    return load_cached_lm(tiny_lm_folder(config), device, "tiny LM")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars or load reports from transformers inside the block (errors say it all)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


BLOCK_LISTS = ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers")
"""where Hugging Face causal LMs keep their decoder blocks (Llama, Qwen2, Mistral; GPT-2; OPT;
GPT-NeoX)"""


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The list of decoder blocks of a Hugging Face causal LM (Llama, Qwen2, Mistral, GPT-2, ...)."""
    for path in BLOCK_LISTS:
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(
        f"model: no decoder block list found in {type(model).__name__} "
        f"(looked for {', '.join(BLOCK_LISTS)})"
    )


def check_model_folder(path: str | Path, option: str = "--model") -> Path:
    """``path`` as a model folder (with a config.json), or a ValueError naming ``option``."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{option}: {path} is not a folder")
    if not (path / "config.json").is_file():
        raise ValueError(f"{option}: {path} is not a model folder (no config.json)")
    return path


def load_lm(path: str | Path, device: torch.device | str = "cpu") -> Any:
    """A causal LM from a local folder (never the hub), in eval mode.

    A folder this lab trained has its files checked against the SHA-256s in its marker; any
    folder whose config.json and weights do not load or do not match (damaged, truncated, edited,
    tensors missing) raises :class:`CheckpointError` naming it."""
    from transformers import AutoModelForCausalLM

    path = check_model_folder(path)
    if (path / MARKER).exists():
        read_sidecar(path / MARKER, expect=_MARKER_TYPES)
    with checkpoint_errors(path, "Hugging Face model folder"), _quiet_transformers():
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                path,
                local_files_only=True,
                ignore_mismatched_sizes=True,  # reported below, in one line
                output_loading_info=True,
            )
        except Exception as error:
            # huggingface_hub's StrictDataclass errors: a config.json value of the wrong type
            if type(error).__name__.startswith("StrictDataclass"):
                raise ValueError(str(error)) from error
            raise
        mismatched = sorted(info.get("mismatched_keys") or [])
        if mismatched:
            key, stored, expected = mismatched[0]
            raise CheckpointError(
                f"{path}: damaged or not a Hugging Face model folder (its weights do not match "
                f"config.json: {len(mismatched)} tensors, e.g. {key} is {tuple(stored)} in the "
                f"weights and {tuple(expected)} by config.json)"
            )
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            raise CheckpointError(
                f"{path}: damaged or not a Hugging Face model folder ({len(missing)} tensors "
                f"missing from its weights, e.g. {missing[0]})"
            )
    return model.to(device).eval()


def text_encoder(model_dir: str | Path) -> Callable[[str], list[int]]:
    """A function from text to the token ids of the model folder's tokenizer (special tokens
    the tokenizer adds included), or to bytes when the folder has none (the byte models of this
    lab)."""
    model_dir = check_model_folder(model_dir)
    if not _has_tokenizer(model_dir):
        config_file = model_dir / "config.json"
        with checkpoint_errors(config_file, "Hugging Face model config"):
            vocab = json.loads(config_file.read_text(encoding="utf-8")).get("vocab_size", 256)
        if isinstance(vocab, bool) or not isinstance(vocab, int):
            raise CheckpointError(f"{config_file}: vocab_size is not an integer ({vocab!r})")
        if vocab < 256:
            raise ValueError(
                f"--model: {model_dir} has no tokenizer files and a vocabulary of {vocab} < 256, "
                "so its text cannot be read as bytes"
            )
        return lambda text: list(text.encode())
    from transformers import AutoTokenizer

    with checkpoint_errors(model_dir, "Hugging Face tokenizer folder"), _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return lambda text: tokenizer(text)["input_ids"]


def encode_file(model_dir: str | Path, text_file: str | Path) -> torch.Tensor:
    """Token ids of ``text_file`` (see :func:`text_encoder`; a byte model reads any bytes)."""
    text_file = Path(text_file)
    encoder = text_encoder(model_dir)
    if not text_file.is_file():
        raise ValueError(f"--text: {text_file} is not a file")
    raw = text_file.read_bytes()
    if not _has_tokenizer(Path(model_dir)):
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--text: {text_file} is not UTF-8 text ({error.reason})") from None
    return torch.tensor(encoder(text), dtype=torch.long)


def _has_tokenizer(model_dir: Path) -> bool:
    return any(model_dir.glob("tokenizer*"))  # this lab's byte models save none


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


def load_generator(path: str | Path, option: str = "--model") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a local causal LM folder that holds its tokenizer, set up for
    batched sampling (left padding; the end token pads when there is no pad token). A missing
    folder or tokenizer raises a ValueError naming ``option``."""
    from transformers import AutoTokenizer

    from mixlab.shared.checks import check_input_folder

    check_input_folder(Path(path), option, containing=("config.json", "tokenizer_config.json"))
    with checkpoint_errors(path, "tokenizer folder"):  # a cut tokenizer.json: one line (issue 80)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return load_lm(path), tokenizer
