"""mixlab.llm_efficiency: lLM efficiency: any-precision quantization, early exit, sparsity, prompt compression and routing.

Each method is a subpackage (``mixlab.llm_efficiency.<method>``) with its public API in ``__all__``.
"""
