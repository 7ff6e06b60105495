"""Prompt-KL: GRPO with an exact KL penalty on the prompt tokens only, against reward hacking.

Reconstructed from the abstract (the paper was not found): TRL's GRPO loss plus
β_p · KL(π_θ ‖ π_ref) summed over the vocabulary at every prompt position, against a frozen copy
of the start policy. A policy that learns a loophole cued by the prompt has to read the prompt
differently; the penalty pins that reading and leaves the response free.

    from mixlab.llm_efficiency.prompt_kl import PromptKLConfig, PromptKLGRPOTrainer

    args = PromptKLConfig(output_dir="out", prompt_kl_beta=0.1, num_generations=8)
    trainer = PromptKLGRPOTrainer(model, reward_funcs=my_reward, args=args,
                                  train_dataset=dataset, processing_class=tokenizer)
    trainer.train()                     # logs prompt_kl and response_kl with TRL's metrics

Hackable tasks with ground truth (:mod:`.tasks`), the SFT policy and evaluation
(:mod:`.policy`), steering and prompt-swap diagnostics (:mod:`.diagnostics`); ``mixlab run
prompt_kl`` is the experiment.
"""

from mixlab.shared.lazy import lazy_exports

# loaded on first use, so that importing the package (CLI, method metadata) needs no torch or TRL
_MODULE_OF = {
    "PromptKLConfig": "trainer",
    "PromptKLGRPOTrainer": "trainer",
    "exact_kl": "trainer",
    "prompt_kl": "trainer",
    "prompt_positions": "trainer",
    "TASKS": "tasks",
    "Example": "tasks",
    "ProxyReward": "tasks",
    "examples": "tasks",
    "grade": "tasks",
    "sft_texts": "tasks",
    "PolicyConfig": "policy",
    "evaluate_policy": "policy",
    "sample_completions": "policy",
    "sft_policy": "policy",
    "activation_difference": "diagnostics",
    "steer": "diagnostics",
    "swap_generate": "diagnostics",
    "Config": "config",
    "METHOD": "config",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
