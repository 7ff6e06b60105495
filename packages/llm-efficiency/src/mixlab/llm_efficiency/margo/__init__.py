"""MARGO: mixed-mode GRPO whose thinking rollouts are scored against the same model's direct
answers (reconstructed from the abstract; the paper was not found).

Each prompt's GRPO group mixes ``num_thinking`` thinking and ``num_direct`` direct rollouts (an
empty think block, or chat-template kwargs like ``enable_thinking=False``). Direct rollouts get
GRPO advantages within the mixed group; thinking rollouts get ``(r − μ)/σ + λ (r − μ_direct)/σ``
(or ``λ min(0, r − μ_direct)/σ`` one-sided), so thinking that overturns an answer the model gets
right directly is suppressed and thinking that recovers one is kept.

    from mixlab.llm_efficiency.margo import MARGOConfig, MARGOTrainer

    args = MARGOConfig(output_dir="out", num_generations=8, num_direct=4, margo_lambda=1.0)
    trainer = MARGOTrainer(model, args=args, train_dataset=dataset,   # prompt + answer columns
                           processing_class=tokenizer)                 # exact-match reward
    trainer.train()          # logs margo/reward_thinking, reward_direct, overturn_rate, think_length

The advantage alone: :func:`margo_advantages`. The closed-book world of the experiment
(:mod:`.world`), its SFT model and two-mode evaluation (:mod:`.policy`); ``mixlab run margo``.
"""

from mixlab.shared.lazy import lazy_exports

# loaded on first use, so that importing the package (CLI, method metadata) needs no torch or TRL
_MODULE_OF = {
    "margo_advantages": "advantages",
    "MARGOConfig": "trainer",
    "MARGOTrainer": "trainer",
    "TESTED_TRL": "trainer",
    "ExactMatch": "reward",
    "answer_of": "reward",
    "World": "world",
    "WorldConfig": "world",
    "Question": "world",
    "questions": "world",
    "sft_texts": "world",
    "world_tokenizer": "world",
    "PolicyConfig": "policy",
    "evaluate_modes": "policy",
    "sft_policy": "policy",
    "Config": "config",
    "METHOD": "config",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
