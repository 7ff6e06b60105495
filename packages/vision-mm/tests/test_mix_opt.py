"""Tests of mixlab.vision_mm.mix_opt: MeZO pieces, schedules, trainer, LoRA, metrics, CLI."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import DDPMScheduler, UNet2DModel

from mixlab.vision_mm.mix_opt import (
    BPHigh,
    Constant,
    MixOptConfig,
    MixOptTrainer,
    Threshold,
    TimestepAware,
    add_lora,
    build_unet,
    captioned_shapes,
    diffusion_loss,
    edge_iou,
    load_lora,
    make_schedule,
    perturb_,
    planned_modes,
    projected_gradient,
    save_lora,
    subject_images,
    zo_step_,
)
from mixlab.vision_mm.mix_opt.lora import lora_parameters


def tiny_unet(rank: int = 2, seed: int = 0):
    """A 16² two-level UNet2DConditionModel (downsampling factor 2) with LoRA."""
    torch.manual_seed(seed)
    unet = build_unet(16, (16, 32), 32)
    add_lora(unet, rank)
    return unet


def batch(n: int = 4, size: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 3, size, size, generator=generator) * 2 - 1
    return images, torch.randn(n, 3, 32, generator=generator)


def nonzero_lora(unet, seed: int = 1) -> None:
    """Random LoRA B (it starts at zero, which leaves A without gradient)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


def fixed_loss(unet, images, text, timestep: int = 400):
    """The diffusion loss at fixed noise and t (what a ZO step's two forwards share)."""
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(7))
    t = torch.full((len(images),), timestep)
    return lambda: diffusion_loss(unet, DDPMScheduler(), images, noise, t, text)


# --- zeroth-order steps -----------------------------------------------------------------------


def test_zo_step_restores_parameters_exactly_at_lr_zero():
    unet = tiny_unet()
    nonzero_lora(unet)
    params = lora_parameters(unet)
    before = [p.detach().clone() for p in params]
    loss = fixed_loss(unet, *batch())
    with torch.inference_mode():
        gradients, mean_loss = zo_step_(params, lambda: loss().item(), [11, 12], eps=1e-2, lr=0.0)
        assert mean_loss == pytest.approx(loss().item(), rel=1e-3)
    assert all(g != 0 for g in gradients)  # the perturbations did change the loss
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
    # MeZO's +1, −2, +1 arithmetic alone restores θ up to rounding.
    projected_gradient(params, lambda: 0.0, seed=3, eps=1e-2, exact=False)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(before, params, strict=True))


def test_perturbation_is_regenerated_from_its_seed():
    params = [torch.zeros(5), torch.zeros(2, 3)]
    perturb_(params, seed=5, scale=1.0)
    first = [p.clone() for p in params]
    perturb_(params, seed=5, scale=-1.0)
    assert all(torch.equal(p, torch.zeros_like(p)) for p in params)
    perturb_(params, seed=5, scale=2.0)
    assert all(torch.allclose(p, 2 * f) for p, f in zip(params, first, strict=True))


def test_zo_gradient_correlates_with_the_true_gradient():
    # On a small model the average of ĝ·z over many directions points along ∇L.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    params = list(model.parameters())
    loss = torch.nn.functional.mse_loss(model(x), y)
    true = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])
    with torch.no_grad():
        estimate = torch.zeros_like(true)
        for seed in range(400):
            g, _ = projected_gradient(
                params, lambda: torch.nn.functional.mse_loss(model(x), y).item(), seed, 1e-3
            )
            generator = torch.Generator().manual_seed(seed)
            z = torch.cat([torch.randn(p.shape, generator=generator).flatten() for p in params])
            estimate += g * z / 400
    assert torch.nn.functional.cosine_similarity(estimate, true, dim=0) > 0.5

    # On the LoRA UNet each projected gradient matches the directional derivative z·∇L.
    unet = tiny_unet()
    nonzero_lora(unet)
    lora = lora_parameters(unet)
    loss_fn = fixed_loss(unet, *batch())
    true = torch.autograd.grad(loss_fn(), lora)
    projected, directional = [], []
    for seed in range(8):
        with torch.inference_mode():
            projected.append(projected_gradient(lora, lambda: loss_fn().item(), seed, 1e-3)[0])
        generator = torch.Generator().manual_seed(seed)
        z = [torch.randn(p.shape, generator=generator) for p in lora]
        directional.append(sum((a * b).sum() for a, b in zip(z, true, strict=True)).item())
    correlation = torch.corrcoef(torch.tensor([projected, directional]))[0, 1]
    assert correlation > 0.9


# --- schedules --------------------------------------------------------------------------------


def test_timestep_aware_schedule_behaves_as_configured():
    schedule = TimestepAware(kappa=10, t0=0.5, gamma=1.0, p_min=0.0)
    assert schedule.p_zo(0.9, 0.0) == 0.0  # all BP-low at the start
    assert schedule.p_zo(0.5, 1.0) == pytest.approx(0.5)  # σ(0) at the end
    ts, progress = [0.1, 0.3, 0.5, 0.7, 0.9], [0.2, 0.5, 0.8]
    for s in progress:  # more ZO at higher timesteps
        values = [schedule.p_zo(t, s) for t in ts]
        assert values == sorted(values)
        assert values[0] < values[-1]
    for t in ts:  # and as training progresses
        values = [schedule.p_zo(t, s) for s in progress]
        assert values == sorted(values)
        assert values[0] < values[-1]
    assert schedule.mean_p_zo() == pytest.approx(0.25, abs=0.01)  # E[σ]·E[s] = ½·½
    flat = TimestepAware(kappa=0, gamma=0, p_min=0.2)  # timestep- and progress-agnostic
    assert flat.p_zo(0.1, 0.1) == flat.p_zo(0.9, 0.9) == pytest.approx(0.7)
    assert TimestepAware(p_min=0.9).p_zo(0.99, 0.99) == 1.0  # clipped
    hard = Threshold(t_threshold=0.6, after=0.5)
    assert [hard.p_zo(t, s) for t, s in [(0.7, 0.6), (0.5, 0.6), (0.7, 0.4)]] == [1.0, 0.0, 0.0]
    assert Constant(0.3).p_zo(0.0, 0.0) == Constant(0.3).p_zo(1.0, 1.0) == 0.3
    assert make_schedule("bp_low").p_zo(0.9, 0.9) == 0.0
    assert make_schedule("zo_high").p_zo(0.1, 0.1) == 1.0
    assert make_schedule("bp_high").bp_resolution == "full"
    assert make_schedule("mix_opt", kappa=5.0) == TimestepAware(kappa=5.0)


def test_trainer_draws_modes_from_the_schedule():
    images, text = batch()
    config = MixOptConfig(resolution=16, low_resolution=8, steps=100, schedule=Threshold(0.5))
    trainer = MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text, config)
    uniforms = torch.linspace(0, 0.999, 50)
    # Threshold: ZO-high exactly at t >= 500, so half the timesteps; each mode's timesteps come
    # from its own side of the threshold.
    mode, p, timesteps = trainer.mode_at(10, 0.49, uniforms)
    assert (mode, p) == ("zo_high", 0.5)
    assert timesteps.min() >= 500
    mode, p, timesteps = trainer.mode_at(10, 0.51, uniforms)
    assert mode == "bp_low"
    assert timesteps.max() < 500
    assert len(set(timesteps.tolist())) == 50  # one timestep per example
    config.schedule = Constant(0.3)
    draws = [trainer.mode_at(5, (u + 0.5) / 1000, uniforms)[0] for u in range(1000)]
    assert draws.count("zo_high") == 300
    assert torch.equal(trainer.mode_at(5, 0.0, uniforms)[2], (uniforms * 1000).long())  # uniform
    config.schedule = BPHigh()
    assert trainer.mode_at(99, 0.0, uniforms)[0] == "bp_high"
    # Mix-Opt's schedule: over the mode draws each example's timestep is uniform, and ZO-high
    # steps get the high ones, so (t, mode) has the law of "draw t, then ZO with p_ZO(t, s)".
    config.schedule = TimestepAware(kappa=10, t0=0.5, gamma=0)
    by_mode: dict[str, list[int]] = {"zo_high": [], "bp_low": []}
    for u in range(200):
        mode, _, timesteps = trainer.mode_at(50, (u + 0.5) / 200, uniforms)
        by_mode[mode] += timesteps.tolist()
    every = torch.tensor(by_mode["zo_high"] + by_mode["bp_low"]).float()
    assert every.mean().item() == pytest.approx(500, abs=15)
    zo, bp = (torch.tensor(by_mode[m]).float().mean().item() for m in ("zo_high", "bp_low"))
    assert zo > 650
    assert bp < 350
    # Runs that differ only in a constant schedule see the same timesteps and draws at every step.
    runs = []
    for schedule in (Constant(0.5), Constant(0.2)):
        config = MixOptConfig(resolution=16, low_resolution=8, steps=6, schedule=schedule)
        runs.append(MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text, config).train())
    assert [h["timesteps"] for h in runs[0]] == [h["timesteps"] for h in runs[1]]
    assert all(len(set(h["timesteps"])) > 1 for h in runs[0])  # per example, not per batch
    # planned_modes knows every step's mode without training (the matched BP-low control's
    # length): Mix-Opt's schedule, whose ZO share grows with progress
    config = MixOptConfig(resolution=16, low_resolution=8, steps=12, seed=3,
                          schedule=TimestepAware(p_min=0.2), zo_lr=1e-3)  # fmt: skip
    history = MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text, config).train()
    planned = planned_modes(config)
    assert planned == [h["mode"] for h in history]
    assert {"bp_low", "zo_high"} == set(planned)
    config.seed = 4
    assert planned_modes(config) != planned  # the draws are the seed's


def test_pretraining_spreads_its_low_resolution_steps_evenly():
    from mixlab.vision_mm.mix_opt.model import ModelSpec, _cache_key, _is_low_step

    for share, steps in ((0.5, 1500), (0.3, 100), (0.0, 50)):
        low = [_is_low_step(step, share) for step in range(steps)]
        assert sum(low) == int(steps * share)
        assert all(abs(sum(low[:n]) - n * share) < 1 for n in range(1, steps))
    assert [_is_low_step(step, 0.5) for step in range(4)] == [False, True, False, True]
    # a single-resolution model keeps the cache key it had before the multi-resolution fields
    assert "low_share" not in _cache_key(ModelSpec())
    assert _cache_key(ModelSpec(low_share=0.5))["low_size"] == 16


# --- trainer ----------------------------------------------------------------------------------


def test_bp_low_trains_at_low_resolution_and_zo_high_at_full():
    images, text = batch()
    unet = tiny_unet()
    seen: list[tuple[int, bool]] = []
    unet.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((args[0].shape[-1], torch.is_grad_enabled())),
        with_kwargs=True,
    )
    config = MixOptConfig(resolution=16, low_resolution=8, steps=6, schedule=Threshold(0.5))
    trainer = MixOptTrainer(unet, DDPMScheduler(), images, text, config)
    for _ in range(6):
        seen.clear()
        before = [p.detach().clone() for p in lora_parameters(unet)]
        entry = trainer.step()
        if entry["mode"] == "bp_low":
            assert seen == [(8, True)]  # one forward with autograd at 8×8
        else:
            assert [size for size, _ in seen] == [16, 16]  # θ + εz and θ − εz at 16×16
            assert not any(grad for _, grad in seen)  # no activations kept
        changed = [
            not torch.equal(a, b) for a, b in zip(before, lora_parameters(unet), strict=True)
        ]
        assert any(changed)  # both kinds of step update the adapter
    modes = {h["mode"] for h in trainer.history}
    assert modes == {"bp_low", "zo_high"}
    frozen = [p for n, p in unet.named_parameters() if "lora_" not in n]
    assert frozen
    assert not any(p.requires_grad for p in frozen)


def test_zo_forwards_share_their_inputs_and_opposite_perturbations():
    # Common random numbers, checked at the UNet: the ±ε forwards of a ZO step see the same
    # noisy images, timesteps and text, at θ + εz and θ − εz.
    images, text = batch()
    unet = tiny_unet()
    nonzero_lora(unet)
    params = lora_parameters(unet)
    calls: list[tuple[torch.Tensor, ...]] = []

    def record(module, args, kwargs):
        inputs = (args[0], args[1], kwargs["encoder_hidden_states"])
        calls.append((*(x.clone() for x in inputs), *(p.detach().clone() for p in params)))

    unet.register_forward_pre_hook(record, with_kwargs=True)
    config = MixOptConfig(resolution=16, low_resolution=8, steps=3, schedule=Constant(1.0))
    trainer = MixOptTrainer(unet, DDPMScheduler(), images, text, config)
    for _ in range(3):
        calls.clear()
        theta = [p.detach().clone() for p in params]
        trainer.step()
        plus, minus = calls
        assert all(torch.equal(a, b) for a, b in zip(plus[:3], minus[:3], strict=True))
        assert len(set(plus[1].tolist())) > 1  # the batch's own timesteps, shared by both
        for a, b, original in zip(plus[3:], minus[3:], theta, strict=True):
            assert not torch.equal(a, original)
            torch.testing.assert_close(a - original, original - b, rtol=1e-4, atol=1e-6)


def test_low_res_images_reach_the_bp_low_forward():
    # A latent model's BP-low trains on the encoding of the downscaled photo, not on resized
    # full-resolution latents: whatever low_res_images holds is what BP-low's forward sees.
    images, text = batch()
    low = torch.arange(4.0)[:, None, None, None].expand(4, 3, 8, 8) / 10  # image i is i / 10
    seen = []
    scheduler = DDPMScheduler()
    add_noise = scheduler.add_noise
    scheduler.add_noise = lambda clean, noise, t: (seen.append(clean), add_noise(clean, noise, t))[
        1
    ]
    config = MixOptConfig(resolution=16, low_resolution=8, steps=4, schedule=Constant(0.0))
    trainer = MixOptTrainer(tiny_unet(), scheduler, images, text, config, low_res_images=low)
    for _ in range(4):
        trainer.step()
    assert len(seen) == 4
    for clean in seen:
        assert clean.shape == (4, 3, 8, 8)
        for x in clean:
            assert any(torch.equal(x, candidate) for candidate in low)
    with pytest.raises(ValueError, match="low_res_images must be \\(4, 3, 8, 8\\)"):
        MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text, config, low_res_images=images)


def test_perturbation_is_drawn_in_the_parameters_dtype():
    params = [torch.zeros(3, 4, dtype=torch.float64)]
    perturb_(params, seed=9, scale=1.0)
    expected = torch.randn(3, 4, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert torch.equal(params[0], expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_perturbation_is_drawn_on_the_parameters_device(dtype):
    params = [torch.zeros(3, 4, device="cuda:0", dtype=dtype), torch.zeros(5, device="cuda:0")]
    perturb_(params, seed=9, scale=1.0)
    generator = torch.Generator(device="cuda:0").manual_seed(9 + 1_000_003)  # cuda:0's offset
    expected = torch.randn(3, 4, generator=generator, device="cuda:0", dtype=dtype)
    assert torch.equal(params[0], expected)
    assert torch.equal(params[1], torch.randn(5, generator=generator, device="cuda:0"))
    perturb_(params, seed=9, scale=-1.0)
    assert all(torch.equal(p, torch.zeros_like(p)) for p in params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_memory_probe_reads_the_cuda_allocator():
    from mixlab.vision_mm.mix_opt import profile

    spec = {"mode": "bp_high", "resolution": 16, "low_resolution": 8, "batch_size": 2,
            "channels": [16, 32], "text_dim": 32, "steps": 1, "device": "cuda"}  # fmt: skip
    profile.check_spec(spec)
    bp_high = profile._probe(spec)
    zo_high = profile._probe({**spec, "mode": "zo_high"})
    for row in (bp_high, zo_high):
        assert row["total_peak_bytes"] >= row["added_peak_bytes"] > 0
    assert bp_high["added_peak_bytes"] > zo_high["added_peak_bytes"]  # backprop keeps activations


def test_trainer_resumes_to_the_uninterrupted_run(tmp_path):
    images, text = batch()

    def trainer():
        config = MixOptConfig(
            resolution=16, low_resolution=8, steps=10, checkpoint_every=4, schedule=Constant(0.5)
        )
        return MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text, config)

    whole = trainer()
    whole.train()
    killed = trainer()
    original_step = killed.step

    def dying_step():
        if killed.step_count == 6:
            raise KeyboardInterrupt
        return original_step()

    killed.step = dying_step
    with pytest.raises(KeyboardInterrupt):
        killed.train(tmp_path / "run")
    resumed = trainer()
    resumed.train(tmp_path / "run")
    assert [h["mode"] for h in resumed.history] == [h["mode"] for h in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(whole.params, resumed.params, strict=True))
    other = MixOptTrainer(
        tiny_unet(), DDPMScheduler(), images, text,
        MixOptConfig(resolution=16, low_resolution=8, steps=10, schedule=Constant(0.2)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="other values of \\['schedule'\\]"):
        other.train(tmp_path / "run")


def test_unet2dmodel_with_class_labels_trains_and_round_trips(tmp_path):
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), layers_per_block=1,
        norm_num_groups=8, num_class_embeds=3,
    )  # fmt: skip
    add_lora(unet, rank=2)
    images, _ = batch()
    config = MixOptConfig(resolution=16, low_resolution=8, steps=4, schedule=Constant(0.5))
    trainer = MixOptTrainer(unet, DDPMScheduler(), images, torch.tensor([0, 1, 2, 0]), config)
    trainer.train()
    save_lora(unet, tmp_path / "lora")
    torch.manual_seed(0)
    fresh = UNet2DModel(**unet.config)
    load_lora(fresh, tmp_path / "lora")
    x, t, labels = torch.randn(2, 3, 16, 16), torch.tensor([3, 700]), torch.tensor([1, 2])
    unet.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(
            unet(x, t, class_labels=labels).sample, fresh(x, t, class_labels=labels).sample
        )


def test_lora_round_trips_in_the_diffusers_format(tmp_path):
    unet = tiny_unet()
    nonzero_lora(unet)
    path = save_lora(unet, tmp_path / "lora")
    assert path.name == "pytorch_lora_weights.safetensors"
    x, t, text = torch.randn(2, 3, 16, 16), torch.tensor([10, 900]), torch.randn(2, 3, 32)
    with torch.no_grad():
        expected = unet(x, t, encoder_hidden_states=text).sample
    torch.manual_seed(0)
    ours = build_unet(16, (16, 32), 32)  # same seed, same base weights as tiny_unet
    load_lora(ours, tmp_path / "lora")
    torch.manual_seed(0)
    theirs = build_unet(16, (16, 32), 32)
    theirs.load_lora_adapter(  # what a pipeline's load_lora_weights calls
        tmp_path / "lora", prefix="unet", weight_name="pytorch_lora_weights.safetensors"
    )
    with torch.no_grad():
        assert torch.equal(ours(x, t, encoder_hidden_states=text).sample, expected)
        assert torch.equal(theirs(x, t, encoder_hidden_states=text).sample, expected)
    base = build_unet(16, (16, 32), 32)
    with pytest.raises(ValueError, match="no LoRA adapter"):
        save_lora(base, tmp_path / "none")
    with pytest.raises(ValueError, match="pytorch_lora_weights"):
        load_lora(base, tmp_path / "missing")
    add_lora(base, rank=3)
    with pytest.raises(ValueError, match="another rank"):
        load_lora(base, tmp_path / "lora")


# --- bad input --------------------------------------------------------------------------------


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="p must be a probability in \\[0, 1\\]"):
        Constant(1.5)
    with pytest.raises(ValueError, match="t0"):
        TimestepAware(t0=-0.1)
    with pytest.raises(ValueError, match="p_min"):
        TimestepAware(p_min=2.0)
    with pytest.raises(ValueError, match="t_threshold"):
        Threshold(t_threshold=1.2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_schedule("cosine")
    images, text = batch()
    with pytest.raises(
        ValueError, match="low_resolution must be a multiple of the UNet's downsampling factor 2"
    ):
        MixOptTrainer(
            tiny_unet(), DDPMScheduler(), images, text, MixOptConfig(16, low_resolution=7)
        )
    deep = build_unet(32, (16, 16, 32, 32), 32)  # factor 8
    add_lora(deep)
    with pytest.raises(ValueError, match="resolution must be a multiple of .* factor 8"):
        MixOptTrainer(deep, DDPMScheduler(), images, text, MixOptConfig(36, low_resolution=16))
    frozen = build_unet(16, (16, 32), 32).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        MixOptTrainer(frozen, DDPMScheduler(), images, text, MixOptConfig(16, low_resolution=8))
    with pytest.raises(ValueError, match="low_resolution"):
        MixOptConfig(resolution=16, low_resolution=32)
    with pytest.raises(ValueError, match="zo_eps"):
        MixOptConfig(zo_eps=0.0)
    with pytest.raises(ValueError, match="one conditioning entry each"):
        MixOptTrainer(tiny_unet(), DDPMScheduler(), images, text[:2], MixOptConfig(16, 8))
    with pytest.raises(ValueError, match="targets"):
        add_lora(build_unet(16, (16, 32), 32), targets=("no_such_layer",))


# --- metrics ----------------------------------------------------------------------------------


def test_edge_iou_sees_structure_not_placement():
    subject = subject_images(4, seed=0).images
    clean = edge_iou(subject, subject)
    shifted = torch.roll(subject, (2, -3), dims=(2, 3))
    assert edge_iou(shifted, subject) == pytest.approx(clean, abs=0.02)
    circles = subject_images(4, seed=0, shape="circle").images  # same fill, other silhouette
    assert edge_iou(circles, subject) < clean - 0.1
    speckled = subject + 0.8 * torch.randn(
        subject.shape, generator=torch.Generator().manual_seed(0)
    )
    assert edge_iou(speckled.clamp(-1, 1), subject) < clean - 0.1
    assert edge_iou(torch.zeros_like(subject), subject) == 0.0


def test_centred_features_tell_the_subject_from_other_shapes():
    from mixlab.vision_mm.mix_opt import evaluation_nets, feature_center, feature_cosine
    from mixlab.vision_mm.mix_opt.metrics import EvalSpec

    feature_net, _ = evaluation_nets(EvalSpec(train_size=64, steps=2))
    center = feature_center(feature_net, n=64)
    subject = subject_images(4, seed=0).images
    others = captioned_shapes(4, seed=3).images
    assert feature_cosine(feature_net, subject, subject, center) > feature_cosine(
        feature_net, others, subject, center
    )


# --- CLI and experiment -----------------------------------------------------------------------


def test_cli_errors_are_one_line(capsys):
    from mixlab.vision_mm.cli import main

    assert main(["mix-opt", "personalize", "--out", "x", "--schedule", "cosine"]) == 2
    assert "schedule must be one of" in capsys.readouterr().err
    assert (
        main(
            ["mix-opt", "personalize", "--out", "x", "--fields", '{"p": 3}', "--schedule", "random"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "probability" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["mix-opt", "profile", "--modes", "sgd"]) == 2


TINY_BASE = dict(
    pretrain_steps=3, pretrain_images=32, base_channels=(8, 16), base_text_dim=16,
    eval_net_steps=2, eval_net_images=32, subject_images=2, steps=4, batch_size=2,
    samples_per_prompt=1, resolution=16, low_resolution=8, sampling_steps=2,
    memory_resolution=16, memory_batch_size=2, n_seeds=1, workers=1, tune_steps=2,
    tune_bp_lrs=(1e-3, 3e-3), tune_low_resolutions=(8,), tune_low_bp_lrs=(1e-3, 3e-3),
    tune_zo_lrs=(0.02, 0.05),
)  # fmt: skip
"""a tiny base UNet (two levels of 8 and 16 channels, 3 pre-training steps), two tuning
candidates a system of 2 steps each, one seed, in this process: the smoke run pre-trains it into
an empty cache in seconds, never the real-size one"""


def test_experiment_runs_and_resumes(tmp_path, monkeypatch):
    from mixlab.vision_mm.mix_opt import experiment, profile
    from mixlab.vision_mm.mix_opt.experiment import METHOD, Config, run

    cache = tmp_path / "cache"
    monkeypatch.setenv("MIXLAB_CACHE", str(cache))
    probed = []

    def in_process(specs):  # the probe itself, without a fresh interpreter (imports take ~30 s)
        for spec in specs:
            profile.check_spec(spec)
        probed.extend(specs)
        return [profile._probe(spec) for spec in specs]

    monkeypatch.setattr(experiment, "profile_modes", in_process)
    config = Config(**TINY_BASE)
    assert experiment.model_spec(config).channels == (8, 16)
    assert METHOD.load_run() is run
    result = METHOD.execute(config, tmp_path / "run")
    assert result.cache["state"] == "cold"  # the tiny base UNet and evaluation nets were trained
    assert {e["entry"].split("/")[1].rsplit("-", 1)[0] for e in result.cache["entries"]} == {
        "shapes-unet",
        "eval-nets",
    }
    assert set(result.metrics) == {"base", *Config().systems}
    # each tuned system's choice is its candidate of lowest validation loss, and the systems
    # that mix take their modes' choices
    cells = json.loads((tmp_path / "run" / "cells.json").read_text())
    tuning = [c for c in cells if c["part"] == "tune"]
    assert len(tuning) == 7  # the un-personalized model's score, then 2 candidates a system
    assert result.metrics["base"]["validation_fidelity"] == tuning[0]["validation_fidelity"]
    for system in ("bp_high", "bp_low", "zo_high"):
        mine = [c for c in tuning if c["system"] == system]
        best = max(mine, key=lambda c: c["validation_fidelity"])
        assert result.metrics[system]["validation_fidelity"] == best["validation_fidelity"]
        for name, value in best["settings"].items():
            assert result.metrics[system][name] == value
    for name in ("bp_lr", "low_resolution"):
        assert result.metrics["mix_opt"][name] == result.metrics["bp_low"][name]
    assert result.metrics["mix_opt"]["zo_lr"] == result.metrics["zo_high"]["zo_lr"]
    # the matched BP-low control ran as many steps as Mix-Opt took BP-low steps
    mix_history = next(c for c in cells if c["part"] == "train" and c["system"] == "mix_opt")
    bp_steps = sum(h[1] == "bp_low" for h in mix_history["history"])
    assert result.metrics["bp_low_matched"]["steps"] == bp_steps
    assert len(result.claims) == 4
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.system for c in result.claims)
    # the regime checks are computed from the measured metrics
    recognisable, check, floor = result.regime
    assert recognisable.holds == (result.metrics["base"]["recognised"] >= 0.8)
    assert "BP-high personalization beats the un-personalized base model" in check.text
    base, bp_high = (result.metrics[s]["subject_fidelity"] for s in ("base", "bp_high"))
    assert check.holds == (bp_high > base + 0.02)
    assert f"{bp_high:.4g}" in check.evidence
    quality = [c for c in result.claims if c.text in check.gates]
    assert len(quality) == 3  # every claim but the memory claim
    assert recognisable.gates == check.gates
    assert all(c.tested is False for c in quality) or (check.holds and recognisable.holds)
    (memory_claim,) = (c for c in result.claims if c.text in floor.gates)
    assert memory_claim.tested is False  # the tiny probe adds far less than 50 MiB per step
    assert [spec["channels"] for spec in probed] == [[8, 16]] * 3  # the tiny base UNet
    assert {spec["resolution"] for spec in probed} == {config.memory_resolution}
    memory = result.metrics
    assert memory["bp_high"]["peak_memory_mb"] >= memory["bp_high"]["added_memory_mb"] >= 0
    mix, random = result.metrics["mix_opt"], result.metrics["random"]
    assert mix["fidelity_over_random_min"] == pytest.approx(
        mix["subject_fidelity"] - random["subject_fidelity"]
    )  # one seed: the worst seed's gap is the gap
    assert random["fidelity_over_random_min"] is None
    assert memory["zo_high"]["zo_share"] == 1.0
    assert memory["bp_low"]["zo_share"] == 0.0
    for system in result.metrics:
        assert (tmp_path / "run" / f"samples_{system}.png").exists()
    assert (tmp_path / "run" / "samples_base_captions.png").exists()
    assert any(c["part"] == "memory" for c in cells)
    # only the tiny base model was pre-trained into the (empty) cache
    assert len(list((cache / "mix_opt").glob("shapes-unet-*"))) == 1
    assert not list((cache / "mix_opt").glob(".*"))  # no checkpoint or partial entry left
    again = METHOD.execute(config, tmp_path / "run", resume=True)
    assert again.metrics == result.metrics
    assert again.cache["state"] == "cold"  # a resumed run counts what its first part built
    assert METHOD.execute(config, tmp_path / "warm").cache["state"] == "warm"
