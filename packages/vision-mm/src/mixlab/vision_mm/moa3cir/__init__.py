"""MoA3CIR: composed image retrieval with item descriptions and attribute-routed attention
(issue 29; the paper and ECCIR were not found: the five towers, MoA³ and the training are
reconstructed from spec §5 on CLIP4Cir's published combiner, see seeds/moa3cir.md).

Five towers over any open_clip model (reference image, reference description, modification text;
target image, target description) feed MoA³, multi-head attention whose heads form attribute
groups weighed by a router on the modification text; the gallery side is a light gated sum, so it
is embedded once::

    towers = ClipTowers(open_clip.create_model("ViT-B-32", pretrained="/models/vit-b-32.bin"))
    model = MoA3CIR(towers, groups=4, shared_heads=4)
    index = model.build_index(gallery_images, ids, descriptions=gallery_descriptions)
    scores, ids = model.search(index, images, ["the same in blue with dots"], descriptions, k=10)
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "AttributeClassifier": "augment",
    "CIRModel": "model",
    "ClipTowers": "towers",
    "Combiner": "model",
    "Encoded": "towers",
    "MoA3Attention": "attention",
    "MoA3Block": "attention",
    "MoA3CIR": "model",
    "MoA3Head": "model",
    "QueryFeatures": "model",
    "RetrievalIndex": "model",
    "SimpleHead": "model",
    "TripletData": "training",
    "TripletFeatures": "training",
    "balance_loss": "attention",
    "concat_features": "training",
    "fit_two_phase": "training",
    "controlled_edits": "augment",
    "encode_triplets": "training",
    "info_nce": "training",
    "recall_at_k": "model",
    "route_supervision_loss": "training",
    "routing_statistics": "attention",
    "target_ranks": "model",
    "tiny_clip": "towers",
    "train_end_to_end": "training",
    "train_head": "training",
    "train_towers": "training",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
