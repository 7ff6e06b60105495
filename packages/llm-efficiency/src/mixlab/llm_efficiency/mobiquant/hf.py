"""MoBiQuant as a transformers quantizer: ``save_pretrained`` and ``from_pretrained`` just work.

    import mixlab.llm_efficiency.mobiquant  # registers the quant_method "mobiquant"
    from transformers import AutoModelForCausalLM

    quantize_(model, MoBiQuantConfig(group_size=128), calib=token_ids)
    model.save_pretrained("out/")                          # config.json gets a quantization_config
    model = AutoModelForCausalLM.from_pretrained("out/")   # the same model: equal logits, dtype

transformers' own registry (``register_quantization_config`` / ``register_quantizer``) maps the
``quant_method`` in a folder's config.json to :class:`MoBiQuantHfConfig` and
:class:`MoBiQuantHfQuantizer`. The quantizer loads quantized folders only (MoBiQuant quantizes
with :func:`~.model.quantize_`, whose routers need calibration tokens): before the tensors load it
turns the freshly built model into an empty MoBiQuant model of the saved config
(:func:`~.model.rebuild`) and checks that the weights hold every tensor of it; after, it restores
the run-time setting the model was saved with (:func:`~.model.run_settings`). Without the
registration transformers only warns "Unknown quantization type" and returns a model whose
quantized layers are random, hence the import hook in the package's ``__init__``.

Needs transformers >= 5 (its loader hands the checkpoint files to the quantizer and builds the
model on the meta device); :func:`~.model.load_quantized` reads the same folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from transformers.quantizers.auto import register_quantization_config, register_quantizer
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from mixlab.llm_efficiency.mobiquant.layer import (
    MoBiLinear,
    MoBiRouter,
    budget_index,
    check_budget,
)
from mixlab.llm_efficiency.mobiquant.model import (
    MoBiQuantConfig,
    finish_loading,
    rebuild,
    run_settings,
    stored_shapes,
)
from mixlab.shared.files import CheckpointError

__all__ = ["QUANT_METHOD", "MoBiQuantHfConfig", "MoBiQuantHfQuantizer", "attach_quantizer"]

QUANT_METHOD = "mobiquant"


@register_quantization_config(QUANT_METHOD)
class MoBiQuantHfConfig(QuantizationConfigMixin):
    """The ``quantization_config`` of a MoBiQuant model's config.json: the fields of
    :class:`~.model.MoBiQuantConfig` and the run-time setting the model was saved with
    (``precision``, ``budget``, ``budget_seed``: see :func:`~.model.run_settings`)."""

    def __init__(
        self,
        quant_method: str = QUANT_METHOD,
        precision: int | None = None,
        budget: float | None = None,
        budget_seed: int | None = None,
        **fields: Any,
    ) -> None:
        if quant_method != QUANT_METHOD:
            raise ValueError(f"quant_method must be {QUANT_METHOD!r}, got {quant_method!r}")
        config = MoBiQuantConfig.from_dict(fields)  # validates
        if precision is not None and (
            isinstance(precision, bool)
            or not isinstance(precision, int)
            or not 1 <= precision <= config.slices
        ):
            raise ValueError(f"precision must be None or in 1..{config.slices}, got {precision!r}")
        if budget is not None:
            if config.router:
                budget_index(budget, config.bits, config.slices)  # a budget with a threshold
            else:
                check_budget(budget, config.bits, config.slices)
        self.quant_method = QUANT_METHOD
        self.__dict__.update(config.to_dict())
        self.precision, self.budget, self.budget_seed = precision, budget, budget_seed

    @classmethod
    def of(cls, model: nn.Module) -> MoBiQuantHfConfig:
        """The config of the MoBiQuant ``model`` as it runs now."""
        return cls(**model.mobiquant_config.to_dict(), **run_settings(model))

    def mobiquant_config(self) -> MoBiQuantConfig:
        return MoBiQuantConfig.from_dict(self.to_dict())

    def run_settings(self) -> dict[str, Any]:
        return {"precision": self.precision, "budget": self.budget, "budget_seed": self.budget_seed}


@register_quantizer(QUANT_METHOD)
class MoBiQuantHfQuantizer(HfQuantizer):
    """Rebuilds a MoBiQuant model inside ``from_pretrained``; ``save_pretrained`` writes it."""

    requires_calibration = True  # loads quantized folders; quantize_ makes them

    def __init__(self, quantization_config: MoBiQuantHfConfig, **kwargs: Any) -> None:
        if not kwargs.get("pre_quantized", True):
            raise ValueError(
                "quantization_config: MoBiQuant does not quantize while loading (its routers "
                "need calibration tokens); load the model, then call mixlab.llm_efficiency."
                "mobiquant.quantize_(model, MoBiQuantConfig(...), calib=token_ids)"
            )
        super().__init__(quantization_config, **kwargs)

    def _process_model_before_weight_loading(
        self, model: nn.Module, checkpoint_files: list[str] | None = None, **kwargs: Any
    ) -> nn.Module:
        if not checkpoint_files or not all(f.endswith(".safetensors") for f in checkpoint_files):
            raise ValueError(
                "from_pretrained: a MoBiQuant folder loads with transformers >= 5 from "
                "safetensors; use mixlab.llm_efficiency.mobiquant.load_quantized"
            )
        shapes = stored_shapes(checkpoint_files)
        rebuild(model, self.quantization_config.mobiquant_config())
        _check_complete(model, shapes, Path(checkpoint_files[0]).parent)
        for module in model.modules():
            # Their initializers reach for the float weights MoBiLinear replaced (GPT-2 rescales
            # c_proj.weight), and every tensor of a MoBiLinear comes from the weights (checked).
            if any(isinstance(child, MoBiLinear) for child in module.children()):
                module._is_hf_initialized = True
        return model

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        finish_loading(model, **self.quantization_config.run_settings())
        return model

    def get_state_dict_and_metadata(self, model: nn.Module) -> tuple[None, dict]:
        # save_pretrained asks this before it writes config.json: record the setting of now
        self.quantization_config = MoBiQuantHfConfig.of(model)
        model.config.quantization_config = self.quantization_config
        return None, {}  # the model's own state dict

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


def attach_quantizer(model: nn.Module) -> None:
    """Mark a MoBiQuant ``model`` for transformers as ``from_pretrained`` does, so that
    ``save_pretrained`` writes the quantization_config and the quantized tensors."""
    config = MoBiQuantHfConfig.of(model)
    model.config.quantization_config = config
    model.hf_quantizer = MoBiQuantHfQuantizer(config, pre_quantized=True)


def _check_complete(model: nn.Module, shapes: dict[str, tuple[int, ...]], folder: Path) -> None:
    """Every tensor of the quantized layers and routers is in the weights, in its shape (else
    transformers would leave it as built, i.e. random, with a warning)."""
    expected = {
        f"{prefix}.{name}": tuple(tensor.shape)
        for prefix, module in model.named_modules()
        if isinstance(module, MoBiLinear | MoBiRouter)
        for name, tensor in module.state_dict().items()
    }
    missing = sorted(set(expected) - set(shapes))
    if missing:
        raise CheckpointError(
            f"{folder}: not the MoBiQuant model its config.json describes ({len(missing)} "
            f"quantized tensors missing from its weights, e.g. {missing[0]})"
        )
    for key in sorted(expected):
        if shapes[key] != expected[key]:
            raise CheckpointError(
                f"{folder}: not the MoBiQuant model its config.json describes ({key} is "
                f"{shapes[key]} in the weights and {expected[key]} by the config)"
            )
