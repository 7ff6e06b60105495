"""Composed image retrieval models: towers + a fusion head, an index of the gallery, recall@K.

A head turns tower outputs into a query embedding (``query``) and a gallery embedding
(``target``), both L2-normalised. Heads:

- :class:`MoA3Head`: MoA³ blocks over [Q; T1 tokens; T2 tokens; T3 tokens] (T2 absent without
  descriptions), read at the learnable query token Q and added to the sum fusion of the pooled
  embeddings (f_T1 + f_T2 + f_T3: phase 1's five-tower sum); targets are the light gated sum
  normalize(f_T4 + g·f_T5) with g = σ(w·[f_T4; f_T5] + b), starting at g ≈ 1 (phase 1's target),
  so the gallery is embedded once, apart from any query.
- :class:`Combiner`: CLIP4Cir's combiner (``ABaldrati/CLIP4Cir`` ``src/combiner.py``) exactly;
  targets are normalize(f_image). With ``descriptions`` (issue 72's control: a combiner that
  reads what MoA3CIR reads) its image input is the reference's f_T1 + f_T2 and its targets are
  normalize(f_T4 + f_T5), phase 1's five-tower sum on both sides.
- :class:`SimpleHead`: no parameters: ``image`` (the reference alone, blind to the edit),
  ``text`` (the modification alone) or ``sum`` (normalize(f_image + f_text), CLIP4Cir's
  fine-tuning objective; with descriptions, phase 1's five-tower sum).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.vision_mm.moa3cir.attention import MoA3Block
from mixlab.vision_mm.moa3cir.towers import ClipTowers, Encoded

__all__ = [
    "CIRModel",
    "Combiner",
    "MoA3CIR",
    "MoA3Head",
    "QueryFeatures",
    "RetrievalIndex",
    "SimpleHead",
    "check_same_count",
    "recall_at_k",
    "target_ranks",
]


@dataclass
class QueryFeatures:
    """The query towers' outputs: T1 reference image, T3 modification text and, when the
    reference has one, T2 its description."""

    image: Encoded
    text: Encoded
    description: Encoded | None = None

    def rows(self, index: Any) -> QueryFeatures:
        description = None if self.description is None else self.description.rows(index)
        return QueryFeatures(self.image.rows(index), self.text.rows(index), description)

    def float(self) -> QueryFeatures:
        """The same features in float32 (caches keep the tokens in float16)."""

        def up(e: Encoded | None) -> Encoded | None:
            return None if e is None else Encoded(e.pooled.float(), e.tokens.float(), e.padding)

        return QueryFeatures(up(self.image), up(self.text), up(self.description))


def check_same_count(name: str, values, images) -> None:
    """``values`` (texts, descriptions, ids) has one entry per image."""
    if values is not None and len(values) != len(images):
        raise ValueError(
            f"{name} and images must have the same count, got {len(values)} and {len(images)}"
        )


# ------------------------------------------------------------------------------------ heads
class SimpleHead(nn.Module):
    """The parameter-free baselines: ``image``, ``text`` or ``sum``; ``sum`` with
    ``descriptions`` is phase 1's five-tower sum, normalize(f_T1 + f_T2 + f_T3) against
    normalize(f_T4 + f_T5) (what the descriptions give before any fusion is learned)."""

    KINDS = ("image", "text", "sum")

    def __init__(self, kind: str, descriptions: bool = False) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {list(self.KINDS)}, got {kind!r}")
        if descriptions and kind != "sum":
            raise ValueError(f"descriptions go with kind 'sum' only, got kind {kind!r}")
        self.kind = kind
        self.uses_descriptions = descriptions

    def query(self, f: QueryFeatures) -> torch.Tensor:
        pooled = {"image": f.image.pooled, "text": f.text.pooled,
                  "sum": f.image.pooled + f.text.pooled}[self.kind]  # fmt: skip
        if self.uses_descriptions and f.description is not None:
            pooled = pooled + f.description.pooled
        return F.normalize(pooled, dim=-1)

    def target(self, image: torch.Tensor, description: torch.Tensor | None = None) -> torch.Tensor:
        if self.uses_descriptions and description is not None:
            image = image + description
        return F.normalize(image, dim=-1)

    @property
    def config(self) -> dict[str, Any]:
        return {"head": "simple", "kind": self.kind, "descriptions": self.uses_descriptions}


class Combiner(nn.Module):
    """CLIP4Cir's combiner on pooled features (spec §5a):

    p_t = Dropout(ReLU(W_t f_txt)), p_i = Dropout(ReLU(W_i f_img)), c = Dropout(ReLU(W_c [p_t; p_i])),
    λ = σ(MLP([p_t; p_i])), q = normalize(W_o c + λ·f_txt + (1 − λ)·f_img), dropout 0.5.

    With ``descriptions`` f_img is the reference image's and description's sum and the targets
    are normalize(f_image + f_description).
    """

    def __init__(
        self, feature_dim: int, projection_dim: int, hidden_dim: int, descriptions: bool = False
    ) -> None:
        super().__init__()
        self.feature_dim, self.projection_dim, self.hidden_dim = (
            feature_dim,
            projection_dim,
            hidden_dim,
        )
        self.text_projection_layer = nn.Linear(feature_dim, projection_dim)
        self.image_projection_layer = nn.Linear(feature_dim, projection_dim)
        self.dropout1, self.dropout2, self.dropout3 = (
            nn.Dropout(0.5),
            nn.Dropout(0.5),
            nn.Dropout(0.5),
        )
        self.combiner_layer = nn.Linear(2 * projection_dim, hidden_dim)
        self.output_layer = nn.Linear(hidden_dim, feature_dim)
        self.dynamic_scalar = nn.Sequential(
            nn.Linear(2 * projection_dim, hidden_dim), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(hidden_dim, 1), nn.Sigmoid(),
        )  # fmt: skip
        self.uses_descriptions = descriptions

    def combine(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        p_text = self.dropout1(F.relu(self.text_projection_layer(text)))
        p_image = self.dropout2(F.relu(self.image_projection_layer(image)))
        joint = torch.cat((p_text, p_image), -1)
        combined = self.dropout3(F.relu(self.combiner_layer(joint)))
        weight = self.dynamic_scalar(joint)
        return F.normalize(
            self.output_layer(combined) + weight * text + (1 - weight) * image, dim=-1
        )

    def query(self, f: QueryFeatures) -> torch.Tensor:
        image = f.image.pooled
        if self.uses_descriptions and f.description is not None:
            image = image + f.description.pooled
        return self.combine(image, f.text.pooled)

    def target(self, image: torch.Tensor, description: torch.Tensor | None = None) -> torch.Tensor:
        if self.uses_descriptions and description is not None:
            image = image + description
        return F.normalize(image, dim=-1)

    @property
    def config(self) -> dict[str, Any]:
        return {"head": "combiner", "feature_dim": self.feature_dim,
                "projection_dim": self.projection_dim, "hidden_dim": self.hidden_dim,
                "descriptions": self.uses_descriptions}  # fmt: skip


class MoA3Head(nn.Module):
    """MoA³ fusion of the query towers' tokens and the gated target fusion.

    ``routed=False, groups=1, shared_heads=0`` is the dense-MoA³ baseline (plain multi-head
    attention); ``descriptions=False`` is the three-tower model (T2 and T5 unused). The output
    projection starts at zero, so training starts from CLIP4Cir's sum fusion.
    """

    def __init__(
        self,
        image_width: int,
        text_width: int,
        embed_dim: int,
        *,
        dim: int = 128,
        heads: int = 8,
        groups: int = 4,
        shared_heads: int = 0,
        depth: int = 1,
        routed: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        per_token: bool = False,
        descriptions: bool = True,
    ) -> None:
        super().__init__()
        self._config = {"head": "moa3", "image_width": image_width, "text_width": text_width,
                        "embed_dim": embed_dim, "dim": dim, "heads": heads, "groups": groups,
                        "shared_heads": shared_heads, "depth": depth, "routed": routed,
                        "temperature": temperature, "top_k": top_k, "per_token": per_token,
                        "descriptions": descriptions}  # fmt: skip
        self.uses_descriptions = descriptions
        self.image_in = nn.Linear(image_width, dim)
        self.text_in = nn.Linear(text_width, dim)
        self.segments = nn.Parameter(torch.randn(3, dim) * 0.02)  # T1, T2, T3
        self.query_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        attention = {"groups": groups, "shared_heads": shared_heads, "routed": routed,
                     "route_dim": None if per_token else embed_dim, "temperature": temperature,
                     "top_k": top_k, "per_token": per_token}  # fmt: skip
        self.blocks = nn.ModuleList(MoA3Block(dim, heads, **attention) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, embed_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.gate = nn.Linear(2 * embed_dim, 1)
        nn.init.zeros_(self.gate.weight)
        # g ≈ 0.98: start at phase 1's target, normalize(f_image + f_description)
        nn.init.constant_(self.gate.bias, 4.0)
        self.last_weights: list[torch.Tensor] = []
        """each block's group weights in the last :meth:`query` (the balance loss, statistics)"""

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @property
    def routed(self) -> bool:
        """Whether a router weighs the head groups (False for dense MoA³)."""
        return self.blocks[0].attention.router is not None

    @property
    def groups(self) -> int:
        """The router's attribute groups G."""
        return self.blocks[0].attention.groups

    def query(self, f: QueryFeatures) -> torch.Tensor:
        batch = f.image.pooled.shape[0]
        parts = [self.query_token.expand(batch, -1, -1),
                 self.image_in(f.image.tokens) + self.segments[0]]  # fmt: skip
        masks = [f.image.tokens.new_zeros(batch, 1 + f.image.tokens.shape[1], dtype=torch.bool)]
        residual = f.image.pooled + f.text.pooled  # the sum fusion phase 1 trained
        if self.uses_descriptions and f.description is not None:
            parts.append(self.text_in(f.description.tokens) + self.segments[1])
            masks.append(f.description.padding)
            residual = residual + f.description.pooled
        parts.append(self.text_in(f.text.tokens) + self.segments[2])
        masks.append(f.text.padding)
        x, padding = torch.cat(parts, 1), torch.cat(masks, 1)
        self.last_weights = []
        for block in self.blocks:
            x, weights = block(x, f.text.pooled, padding)
            self.last_weights.append(weights)
        return F.normalize(self.out(self.norm(x[:, 0])) + residual, dim=-1)

    def target(self, image: torch.Tensor, description: torch.Tensor | None = None) -> torch.Tensor:
        if not self.uses_descriptions or description is None:
            return F.normalize(image, dim=-1)
        gate = torch.sigmoid(self.gate(torch.cat([image, description], -1)))
        return F.normalize(image + gate * description, dim=-1)


def build_head(config: dict[str, Any]) -> nn.Module:
    """A head from its ``config`` (what :attr:`config` of each head returns)."""
    config = dict(config)
    kind = config.pop("head")
    if kind == "simple":
        return SimpleHead(config["kind"], config.get("descriptions", False))
    if kind == "combiner":
        return Combiner(**config)
    if kind == "moa3":
        return MoA3Head(**config)
    raise ValueError(f"head must be one of ['simple', 'combiner', 'moa3'], got {kind!r}")


# ------------------------------------------------------------------------------------ model
class CIRModel(nn.Module):
    """Towers and a fusion head: ``encode_query`` for queries, ``encode_target`` and
    :meth:`build_index` for the gallery (embedded once), :meth:`search` for the top k."""

    def __init__(self, towers: ClipTowers, head: nn.Module) -> None:
        super().__init__()
        self.towers, self.head = towers, head

    def query_features(
        self, images: torch.Tensor, texts: list[str], descriptions: list[str] | None = None
    ) -> QueryFeatures:
        check_same_count("texts", texts, images)
        description = None
        if descriptions is not None and self.head.uses_descriptions:
            check_same_count("descriptions", descriptions, images)
            description = self.towers.text(
                self.towers.tokenize(descriptions), "reference_description"
            )
        image = self.towers.image(images, "reference_image")
        text = self.towers.text(self.towers.tokenize(texts), "modification")
        return QueryFeatures(image, text, description)

    def encode_query(
        self, images: torch.Tensor, texts: list[str], descriptions: list[str] | None = None
    ) -> torch.Tensor:
        """``[B, E]`` normalised query embeddings of reference ``images`` ([0, 1]), modification
        ``texts`` and, optionally, the references' ``descriptions``."""
        return self.head.query(self.query_features(images, texts, descriptions))

    def encode_target(
        self, images: torch.Tensor, descriptions: list[str] | None = None
    ) -> torch.Tensor:
        """``[B, E]`` normalised gallery embeddings (independent of any query)."""
        image = self.towers.image(images, "target_image").pooled
        description = None
        if descriptions is not None and self.head.uses_descriptions:
            check_same_count("descriptions", descriptions, images)
            ids = self.towers.tokenize(descriptions)
            description = self.towers.text(ids, "target_description").pooled
        return self.head.target(image, description)

    @torch.no_grad()
    def build_index(
        self,
        images: torch.Tensor,
        ids: list[str] | None = None,
        descriptions: list[str] | None = None,
        batch_size: int = 256,
    ) -> RetrievalIndex:
        """Embed the gallery once, in batches."""
        if len(images) == 0:
            raise ValueError("the gallery is empty: give at least one image")
        ids = [str(i) for i in range(len(images))] if ids is None else list(ids)
        check_same_count("ids", ids, images)
        check_same_count("descriptions", descriptions, images)
        was_training = self.training
        self.eval()
        chunks = []
        for start in range(0, len(images), batch_size):
            rows = slice(start, start + batch_size)
            chunk = None if descriptions is None else descriptions[rows]
            chunks.append(self.encode_target(images[rows], chunk).float().cpu())
        self.train(was_training)
        return RetrievalIndex(torch.cat(chunks), ids)

    @torch.no_grad()
    def search(
        self,
        index: RetrievalIndex,
        images: torch.Tensor,
        texts: list[str],
        descriptions: list[str] | None = None,
        k: int = 10,
    ) -> tuple[torch.Tensor, list[list[str]]]:
        """The top ``k`` gallery items per query: (cosine scores ``[B, k]``, their ids)."""
        was_training = self.training
        self.eval()
        queries = self.encode_query(images, texts, descriptions).float().cpu()
        self.train(was_training)
        return index.search(queries, k)

    # ------------------------------------------------------------------------ saving
    def save_pretrained(self, folder: str | Path, clip_config: dict[str, Any]) -> None:
        """``moa3cir.json`` (the towers' open_clip config and the head's) and
        ``model.safetensors``; ``clip_config`` is {"name": open_clip model name} or the keyword
        arguments of :func:`~.towers.tiny_clip`."""
        from safetensors.torch import save_model

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"clip": clip_config, "share": self.towers.share, "head": self.head.config}
        (folder / "moa3cir.json").write_text(json.dumps(config, indent=1))
        save_model(self, str(folder / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> CIRModel:
        from safetensors.torch import load_model

        folder = Path(folder)
        if not (folder / "moa3cir.json").is_file():
            raise ValueError(f"--model {folder} holds no moa3cir.json (save with save_pretrained)")
        config = json.loads((folder / "moa3cir.json").read_text())
        model = cls(
            ClipTowers(build_clip(config["clip"]), share=config["share"]),
            build_head(config["head"]),
        )
        load_model(model, str(folder / "model.safetensors"))
        return model.eval()


class MoA3CIR(CIRModel):
    """The five-tower model with MoA³ fusion over ``towers``; keyword arguments go to
    :class:`MoA3Head`."""

    def __init__(self, towers: ClipTowers, **head: Any) -> None:
        super().__init__(
            towers, MoA3Head(towers.image_width, towers.text_width, towers.embed_dim, **head)
        )


def build_clip(config: dict[str, Any]):
    """An open_clip model from a saved ``clip`` config: a named architecture (its weights come
    from the saved state) or :func:`~.towers.tiny_clip`'s arguments."""
    if "name" in config:
        import open_clip

        return open_clip.create_model(config["name"], pretrained=None)
    from mixlab.vision_mm.moa3cir.towers import tiny_clip

    return tiny_clip(**config)


# ------------------------------------------------------------------------------------ index
@dataclass
class RetrievalIndex:
    """Normalised gallery embeddings ``[N, E]`` and their ids."""

    embeddings: torch.Tensor
    ids: list[str]

    def __post_init__(self) -> None:
        if len(self.ids) == 0:
            raise ValueError("the gallery is empty: an index needs at least one item")
        if len(self.ids) != len(self.embeddings):
            raise ValueError(f"ids and embeddings must have the same count, got {len(self.ids)} "
                             f"and {len(self.embeddings)}")  # fmt: skip

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, queries: torch.Tensor, k: int = 10) -> tuple[torch.Tensor, list[list[str]]]:
        if not isinstance(k, int) or not 1 <= k <= len(self):
            raise ValueError(
                f"k must be an integer in [1, {len(self)}] (the gallery size), got {k!r}"
            )
        scores, rows = (queries @ self.embeddings.T).topk(k, dim=-1)
        return scores, [[self.ids[j] for j in row] for row in rows.tolist()]

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        save_file({"embeddings": self.embeddings.contiguous()}, str(path),
                  metadata={"ids": json.dumps(self.ids)})  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> RetrievalIndex:
        """What :meth:`save` wrote; another file (a model's weights, a damaged index) is refused
        by name (issue 80: a TypeError or KeyError from inside)."""
        from safetensors import SafetensorError, safe_open

        wrong = f"{str(path)!r} is not an index written by RetrievalIndex.save"
        try:
            with safe_open(str(path), "pt") as f:
                metadata = f.metadata() or {}
                if "ids" not in metadata or "embeddings" not in set(f.keys()):
                    raise ValueError(f"{wrong}: it has no 'ids' and 'embeddings'")
                ids, embeddings = json.loads(metadata["ids"]), f.get_tensor("embeddings")
        except (SafetensorError, json.JSONDecodeError) as error:
            raise ValueError(f"{wrong} ({error})") from None
        if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise ValueError(f"{wrong}: its ids are not a list of names")
        if embeddings.dim() != 2:
            raise ValueError(f"{wrong}: embeddings of shape {tuple(embeddings.shape)}")
        return cls(embeddings, ids)


def target_ranks(
    queries: torch.Tensor, gallery: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The 0-based rank of each query's target (gallery row ``targets[i]``) among all gallery
    items by cosine: the count of items scoring strictly higher (ties in the target's favour,
    as a sort that keeps the target first would)."""
    scores = queries @ gallery.T
    own = scores.gather(1, targets[:, None])
    return (scores > own).sum(1)


def recall_at_k(ranks: torch.Tensor, ks: tuple[int, ...] = (1, 10, 50)) -> dict[str, float]:
    """R@K: the share of queries whose target ranks in the top K."""
    return {f"R@{k}": float((ranks < k).float().mean()) for k in ks}
