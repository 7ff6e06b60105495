"""MoH's Mamba blocks, routed block and diffusion backbone: the plain block as a special case, the
gate, zero init, precomputed routes, gradients, save/load, seeded sampling and refusals."""

from __future__ import annotations

import pytest
import torch

from mixlab.attention_arch.moh import BiMamba, Mamba, MoHBlock, MoHDiffusion, Routes
from mixlab.attention_arch.moh.training import TrainSpec, sample, train

torch.set_num_threads(1)
torch.set_flush_denormal(True)

FULL = {"levels": (1, 2), "experts": ("raster", "zigzag", "conv", "mlp"), "depth_gate": True}
TINY = {"sample_size": 8, "patch_size": 2, "width": 16, "depth": 2, "d_state": 4, "expand": 1.0}


def perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Random values in every parameter, so zero-initialised gates do not hide a path."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))


def test_mamba_blocks_keep_the_shape_and_bimamba_sees_both_directions():
    x = torch.randn(2, 16, 12)
    causal = Mamba(12, d_state=4, d_conv=3, expand=2, backend="ref")
    assert causal(x).shape == x.shape
    # causal: the first output does not depend on later tokens
    changed = x.clone()
    changed[:, -1] += 1
    torch.testing.assert_close(causal(x)[:, 0], causal(changed)[:, 0])
    both = BiMamba(12, d_state=4, expand=2, order="zigzag", backend="ref")
    assert not torch.allclose(both(x, (4, 4))[:, 0], both(changed, (4, 4))[:, 0])
    # the parallel scan gives the same block output
    both.backend = "mambapy"
    parallel = both(x, (4, 4))
    both.backend = "ref"
    torch.testing.assert_close(parallel, both(x, (4, 4)), atol=1e-5, rtol=1e-5)


def test_one_hot_routes_on_the_raster_expert_equal_the_plain_block():
    torch.manual_seed(0)
    routed = MoHBlock(16, d_state=4, expand=1.0, backend="ref", **FULL)
    plain = MoHBlock(16, d_state=4, expand=1.0, backend="ref")
    perturb(routed)
    plain.experts[0].load_state_dict(routed.experts[0].state_dict())
    plain.mlp.load_state_dict(routed.mlp.state_dict())
    plain.adaLN_modulation.load_state_dict(routed.adaLN_modulation.state_dict())
    x, c = torch.randn(3, 16, 16), torch.randn(3, 16)
    one_hot = Routes(
        levels=torch.tensor([[1.0, 0.0]]).expand(3, -1),
        experts=torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(3, -1),
        gate=torch.ones(3),
    )
    torch.testing.assert_close(routed(x, c, (4, 4), one_hot), plain(x, c, (4, 4)))


def test_a_closed_gate_is_the_identity():
    block = MoHBlock(16, d_state=4, expand=1.0, backend="ref", **FULL)
    perturb(block)
    x, c = torch.randn(2, 16, 16), torch.randn(2, 16)
    closed = Routes(torch.full((2, 2), 0.5), torch.full((2, 4), 0.25), torch.zeros(2))
    torch.testing.assert_close(block(x, c, (4, 4), closed), x)
    opened = closed._replace(gate=torch.ones(2))
    assert not torch.allclose(block(x, c, (4, 4), opened), x)


def test_the_backbone_outputs_zero_at_init_and_the_blocks_start_as_identities():
    model = MoHDiffusion(**TINY, **FULL)
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(model(x, torch.tensor([3, 700])).sample, torch.zeros_like(x))
    block, tokens, c = model.blocks[0], torch.randn(2, 16, 16), torch.randn(2, 16)
    torch.testing.assert_close(block(tokens, c, (4, 4)), tokens)


def test_precomputed_routes_equal_on_the_fly_ones_and_skip_closed_blocks():
    torch.manual_seed(0)
    model = MoHDiffusion(**TINY, **FULL, top_k=1).eval()
    perturb(model)
    with torch.no_grad():  # close block 1's gate at every t, keep block 0 open
        model.blocks[1].router.net[2].bias[-1] = -50.0
        model.blocks[0].router.net[2].bias[-1] = 50.0
    x = torch.randn(4, 1, 8, 8)
    timesteps = torch.tensor([999, 500, 10])
    with torch.no_grad():
        expected = [model(x, t).sample for t in timesteps]
        model.precompute_routes(timesteps)
        assert model.route_table is not None
        calls = []
        hook = model.blocks[1].router.register_forward_hook(lambda *a: calls.append(1))
        got = [model(x, t).sample for t in timesteps]
        hook.remove()
    assert not calls  # the table replaced the routers
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e)
    assert float(model.route_table[999.0][1].gate) == 0.0


def test_hard_routes_run_each_expert_on_its_own_rows_only(monkeypatch):
    """Top-1 dispatch equals computing every expert on every row and weighting by the masked
    probabilities (outputs and gradients); each expert sees only the rows routed to it."""
    from mixlab.attention_arch.moh import model as moh_model

    torch.manual_seed(0)
    model = MoHDiffusion(**TINY, **FULL, top_k=1).train()
    perturb(model)
    x, t = torch.randn(8, 1, 8, 8), torch.tensor([0, 90, 200, 333, 500, 650, 800, 999])

    def loss_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(1)  # the same Gumbel noise for the gate
        out = model(x, t).sample
        out.pow(2).mean().backward()
        # an expert no row was routed to gets no gradient: zero, as behind a 0 weight
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                 for p in model.parameters()]  # fmt: skip
        return out.detach(), grads

    seen = []
    hooks = [expert.register_forward_hook(lambda m, args, out: seen.append(len(args[0])))
             for block in model.blocks for expert in block.experts]  # fmt: skip
    dispatched, dispatched_grads = loss_and_grads()
    for hook in hooks:
        hook.remove()
    assert sum(seen) == len(model.blocks) * len(x)  # one expert call per sample and block
    assert any(0 < rows < len(x) for rows in seen)  # some experts ran on part of the batch
    monkeypatch.setattr(moh_model, "_routed_rows", lambda weight: None)  # every row everywhere
    dense, dense_grads = loss_and_grads()
    torch.testing.assert_close(dispatched, dense)
    for got, want in zip(dispatched_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_expert_calls_count_soft_hard_and_closed_gates():
    torch.manual_seed(0)
    t = torch.tensor([10, 500, 990])
    assert MoHDiffusion(**TINY).expert_calls(t) == 2  # plain: one per block
    assert MoHDiffusion(**TINY, **FULL).expert_calls(t) == 2 * 2 * 4  # soft: levels x experts
    hard = MoHDiffusion(**TINY, **FULL, top_k=1)
    assert hard.expert_calls(t) == 2
    with torch.no_grad():
        hard.blocks[1].router.net[2].bias[-1] = -50.0  # block 1 closed at every t
    assert hard.expert_calls(t) == 1
    # at inference a batch of mixed gates computes the open rows only, as one row at a time
    perturb(hard)
    with torch.no_grad():
        hard.blocks[0].router.net[2].weight[-1] = 0.0
        hard.blocks[0].router.net[2].bias[-1] = 0.0
        hard.blocks[0].router.net[2].weight[-1, 0] = 5.0  # open for some t, closed for others
    hard.eval()
    gates = hard.blocks[0].router(hard.time_embedding(t, 3))[0].gate
    assert 0 < float(gates.sum()) < 3
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        rows = torch.cat([hard(x[i : i + 1], t[i : i + 1]).sample for i in range(3)])
        torch.testing.assert_close(hard(x, t).sample, rows)


def test_flops_count_closed_blocks_in_training_but_not_at_inference():
    from mixlab.attention_arch.moh.experiment import forward_flops

    torch.manual_seed(0)
    model = MoHDiffusion(**TINY, **FULL, top_k=1).requires_grad_(False)  # as an EMA copy
    with torch.no_grad():
        for block in model.blocks:
            block.router.net[2].bias[-1] = -50.0  # every gate closed
    t = torch.tensor([10, 500, 990])
    # training runs every block (the straight-through gate needs each update) ...
    assert forward_flops(model, t, train=True) > 2 * forward_flops(model, t)
    # ... inference only the embeddings and the final layer
    assert model.expert_calls(t) == 0


def test_gradients_reach_every_expert_level_and_gate():
    torch.manual_seed(0)
    model = MoHDiffusion(**TINY, **FULL).train()
    perturb(model)
    out = model(torch.randn(8, 1, 8, 8), torch.randint(0, 1000, (8,)))
    (out.sample.pow(2).mean() + out.balance_loss + out.depth_cost).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_static_routing_ignores_the_timestep_and_timestep_routing_does_not():
    torch.manual_seed(0)
    static = MoHDiffusion(**TINY, **FULL, routing="static")
    routed = MoHDiffusion(**TINY, **FULL)
    perturb(static)
    perturb(routed)
    t = torch.tensor([0.0, 999.0])
    g = static.route_probabilities(t)["experts"]
    torch.testing.assert_close(g[0], g[1])
    assert not torch.allclose(routed.route_probabilities(t)["experts"][0],
                              routed.route_probabilities(t)["experts"][1])  # fmt: skip
    own = {n for n, _ in routed.named_parameters()}
    assert {n for n, _ in static.named_parameters()} - own == {
        f"blocks.{i}.router.constant" for i in range(2)
    }


def test_save_and_load_round_trip(tmp_path):
    model = MoHDiffusion(**TINY, **FULL, num_classes=3)
    perturb(model)
    model.save_pretrained(tmp_path)
    loaded = MoHDiffusion.from_pretrained(tmp_path).eval()
    x, t, y = torch.randn(2, 1, 8, 8), torch.tensor([5, 600]), torch.tensor([0, 3])
    torch.testing.assert_close(loaded(x, t, y).sample, model.eval()(x, t, y).sample)
    assert loaded.config.experts == FULL["experts"] or list(loaded.config.experts) == list(
        FULL["experts"]
    )


def test_training_lowers_the_loss_resumes_exactly_and_sampling_is_seeded(tmp_path):
    images = torch.rand(32, 1, 8, 8) * 2 - 1
    spec = TrainSpec(steps=6, batch_size=8, checkpoint_every=3, seed=1)
    torch.manual_seed(0)
    whole, _history = train(MoHDiffusion(**TINY, **FULL), images, spec)
    torch.manual_seed(0)
    first = MoHDiffusion(**TINY, **FULL)

    def kill(step, ema):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # killed at step 5, after the checkpoint of step 3
        train(first, images, spec, out_dir=tmp_path, on_checkpoint=kill, eval_steps=(5,))
    torch.manual_seed(123)  # a resumed run must not depend on the global seed
    resumed, _ = train(MoHDiffusion(**TINY, **FULL), images, spec, out_dir=tmp_path, resume=True)
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    one = sample(whole, 5, steps=3, seed=7, batch_size=2)
    assert one.shape == (5, 1, 8, 8)
    assert one.abs().max() <= 1
    torch.testing.assert_close(one, sample(whole, 5, steps=3, seed=7, batch_size=5))
    assert not torch.equal(one, sample(whole, 5, steps=3, seed=8))


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"patch_size": 3}, "patch_size must be a divisor"),
        ({"levels": (1, 3)}, "levels must be pooling factors that divide"),
        ({"experts": ("raster", "spiral")}, "experts must be distinct kinds"),
        ({"layer_orders": ("diagonal",)}, "layer_orders must be None or scan orders"),
        ({"d_state": 0}, "d_state must be an integer >= 1"),
        ({"top_k": 3}, "top_k must be None"),
        ({"backend": "cuda"}, "backend must be one of"),
    ],
)
def test_bad_architectures_are_refused(arguments, match):
    with pytest.raises(ValueError, match=match):
        MoHDiffusion(**{**TINY, **arguments})


def test_bad_timesteps_and_missing_backends_are_refused():
    model = MoHDiffusion(**TINY)
    x = torch.randn(2, 1, 8, 8)
    for t in (1000, -1, torch.tensor([1, 2, 3])):
        with pytest.raises(ValueError, match="timestep must be"):
            model(x, t)
    with pytest.raises(ValueError, match="sample must be"):
        model(torch.randn(2, 1, 7, 7), 3)
    try:  # mamba-ssm is a CUDA extra, absent here
        import mamba_ssm  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs the mamba-ssm package"):
            MoHDiffusion(**TINY, backend="mamba_ssm")(x, 3)
