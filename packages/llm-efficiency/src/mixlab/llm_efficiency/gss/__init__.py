"""GSS: gated subspace steering against verbatim memorization, at inference (arXiv 2602.08901).

A closed-form set of probe/steer pairs at one decoder layer: where a probe fires on the hidden
state (|uᵀh| > ε, about 5 % of general tokens), the steer pushes h off the memorized
continuation; elsewhere the model is untouched, bit for bit.

    from mixlab.llm_efficiency.gss import fit_gss, load_steer

    steer = fit_gss(model, memorized_ids, general_ids, reference=ref_model, layer=2, rank=5)
    with steer:                                   # a forward hook on block 2
        model.generate(input_ids, max_new_tokens=32)
    steer.gate_rate, steer.save("steer.safetensors")
    with load_steer("steer.safetensors", model): ...

The baselines (ungated GSS, mean-difference steering, gradient ascent, NPO, hard-concrete and
BalancedSubnet-style masks) share the contract ``method.mitigate(model, data)`` in
:mod:`.baselines`; ``mixlab run gss`` is the experiment on the memorization lab.
"""

from mixlab.shared.lazy import lazy_exports

# loaded on first use, so that importing the package (CLI, method metadata) needs no torch
_MODULE_OF = {
    "ALPHA_MODES": "steer",
    "GSSSteer": "steer",
    "closed_form": "steer",
    "fit_gss": "steer",
    "hidden_states": "steer",
    "load_steer": "steer",
    "memorization_signal": "steer",
    "memorized_activations": "steer",
    "GSS": "baselines",
    "NPO": "baselines",
    "BalancedSubnet": "baselines",
    "GradientAscent": "baselines",
    "HardConcreteMask": "baselines",
    "MeanDifference": "baselines",
    "Mitigated": "baselines",
    "MitigationData": "baselines",
    "Config": "config",
    "METHOD": "config",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
