"""mixlab.rl: reinforcement learning: multi-agent, exploration and neural routing.

Each method is a subpackage (``mixlab.rl.<method>``) with its public API in ``__all__``.
"""
