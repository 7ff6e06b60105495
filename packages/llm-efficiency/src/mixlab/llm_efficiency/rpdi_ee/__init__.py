"""RPDI-EE: training-free early exit for reasoning models (arXiv 2603.14251).

The Reasoning Path Deviation Index (local over global mean token entropy of the think segment)
ends thinking when it exceeds a threshold, by forcing ``</think>`` inside the same ``generate``
call: no extra model, no extra forward pass.

    from mixlab.llm_efficiency.rpdi_ee import RPDIExitProcessor

    proc = RPDIExitProcessor.from_tokenizer(tokenizer, window=512, threshold=2.0)
    out = model.generate(**inputs, logits_processor=[proc], do_sample=True, temperature=0.6)
    proc.exit_steps, proc.traces  # per row: think step of the exit (or None), index per step

The baselines (fixed budget, DEER-, Dynasor- and EAT-style probing exits) share the contract and
count the extra forward tokens their probes cost; :func:`generate_all` runs any of them over a
list of prompts; ``mixlab run rpdi_ee`` is the experiment on the reasoning toy.
"""

from mixlab.shared.lazy import lazy_exports

# loaded on first use, so that importing the package (CLI, method metadata) needs no torch
_MODULE_OF = {
    "VARIANTS": "processor",
    "RPDIExitProcessor": "processor",
    "ThinkExitProcessor": "processor",
    "token_entropy": "processor",
    "DEERExitProcessor": "baselines",
    "DynasorExitProcessor": "baselines",
    "EATExitProcessor": "baselines",
    "FixedBudgetProcessor": "baselines",
    "METHODS": "evaluate",
    "generate_all": "evaluate",
    "make_processor": "evaluate",
    "Config": "config",
    "METHOD": "config",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
