"""MoP's pieces (issue 28, in progress): K = 1 on the last layer is the resampler, probes permute
with their router rows, layer and count checks, the losses' extremes, the stop-gradient, the
participation ratio, and the paired scenes."""

import numpy as np
import pytest
import torch

from mixlab.vision_mm.mop.losses import (
    MoPXLoss,
    alignment_loss,
    disentanglement_loss,
    participation_ratio,
    probe_cosine,
    probe_diagnostics,
)
from mixlab.vision_mm.mop.probes import MixtureOfProbes, Resampler, RoutedResamplers
from mixlab.vision_mm.mop.scenes import ANSWERABLE, QUESTION_TYPES, make_scenes


def _states(layers=5, batch=3, tokens=7, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, tokens, dim, generator=g) for _ in range(layers))


def test_one_probe_on_the_last_layer_is_the_resampler():
    torch.manual_seed(0)
    mop = MixtureOfProbes(16, 5, num_probes=1, queries=4, layers=[-1])
    resampler = Resampler(16, queries=4)
    resampler.probe.load_state_dict(mop.probes[0].state_dict())
    states = _states()
    out, ref = mop(states), resampler(states)
    torch.testing.assert_close(out.prefix, ref.prefix)
    torch.testing.assert_close(out.weights, torch.ones(3, 1))


def test_permuting_probes_with_their_router_rows_keeps_the_output():
    torch.manual_seed(0)
    mop = MixtureOfProbes(16, 5, num_probes=3, queries=4, layers=[1, 3, 4])
    states = _states()
    order = [2, 0, 1]
    permuted = MixtureOfProbes(
        16, 5, num_probes=3, queries=4, layers=[mop.layers[k] for k in order]
    )
    permuted.load_state_dict(mop.state_dict())
    with torch.no_grad():
        for new, old in enumerate(order):
            permuted.probes[new].load_state_dict(mop.probes[old].state_dict())
        permuted.router[-1].weight.copy_(mop.router[-1].weight[order])
        permuted.router[-1].bias.copy_(mop.router[-1].bias[order])
    torch.testing.assert_close(permuted(states).prefix, mop(states).prefix, atol=1e-6, rtol=1e-5)


def test_soft_layer_mix_and_routed_resamplers_run_and_train():
    states = tuple(s.requires_grad_() for s in _states())
    for module in (MixtureOfProbes(16, 5, layers="soft"), RoutedResamplers(16, experts=3, depth=2)):
        out = module(states)
        assert out.prefix.shape == (3, 8, 16)
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(3))
        out.prefix.square().mean().backward()
        assert all(p.grad is not None for p in module.parameters())


def test_bad_probe_settings_name_the_parameter():
    with pytest.raises(ValueError, match="num_probes must be an integer >= 1"):
        MixtureOfProbes(16, 5, num_probes=0)
    with pytest.raises(ValueError, match=r"layers must be in \[-5, 4\]"):
        MixtureOfProbes(16, 5, num_probes=2, layers=[1, 5])
    with pytest.raises(ValueError, match="one layer per probe"):
        MixtureOfProbes(16, 5, num_probes=2, layers=[1])
    with pytest.raises(ValueError, match="expected 5 hidden states, got 4"):
        MixtureOfProbes(16, 5)(_states(layers=4))


def test_disentanglement_is_zero_for_orthogonal_and_maximal_for_identical_probes():
    eye = torch.eye(4)[None].repeat(2, 1, 1)  # 2 samples, 4 orthogonal probe means
    assert disentanglement_loss(eye, hinge=False) == pytest.approx(0.0)
    same = torch.randn(2, 1, 8).repeat(1, 4, 1)
    assert disentanglement_loss(same, hinge=False) == pytest.approx(1.0)
    assert probe_cosine(same) == pytest.approx(1.0)
    spread = torch.randn(256, 4, 8) * 3  # high variance: the hinge is off
    assert disentanglement_loss(spread, gamma=1.0) == pytest.approx(
        disentanglement_loss(spread, hinge=False)
    )
    assert (
        disentanglement_loss(torch.zeros(8, 4, 8) + torch.eye(4, 8), gamma=1.0) > 3.9
    )  # constants


def test_participation_ratio_is_k_for_the_identity_and_one_for_rank_one():
    assert participation_ratio(torch.eye(5)) == pytest.approx(5.0)
    assert participation_ratio(torch.outer(torch.randn(5), torch.randn(9))) == pytest.approx(1.0)
    diagnostics = probe_diagnostics(torch.randn(16, 4, 6, 8), torch.full((16, 4), 0.25))
    assert diagnostics["router_entropy"] == pytest.approx(np.log(4))


def test_alignment_sends_no_gradient_into_the_target():
    student = torch.randn(4, 3, 5, 8, requires_grad=True)
    teacher = torch.randn(4, 3, 5, 8, requires_grad=True)
    alignment_loss(student, teacher).backward()
    assert student.grad.abs().sum() > 0
    assert teacher.grad is None
    total, logs = MoPXLoss(lambda_x=1.0, lambda_d=0.1)(
        {"rgb": torch.tensor(1.0), "depth": torch.tensor(2.0)},
        {"rgb": student, "depth": teacher}, pairs=(("rgb", "depth"),),
    )  # fmt: skip
    assert total > 3.0
    assert set(logs) == {"task/rgb", "task/depth", "align", "dis"}
    with pytest.raises(ValueError, match="lambda_d must be a finite number >= 0"):
        MoPXLoss(lambda_d=-1)


def test_scenes_are_seeded_paired_and_answerable():
    a, b = make_scenes(40, seed=3), make_scenes(40, seed=3)
    np.testing.assert_array_equal(a.images["rgb"], b.images["rgb"])
    assert a.images["rgb"].shape == (40, 3, 32, 32)
    assert a.images["depth"].shape == (40, 1, 32, 32)
    assert a.types[:4] == list(QUESTION_TYPES)
    assert set(ANSWERABLE["rgb"]) ^ set(ANSWERABLE["depth"]) == {"colour", "depth"}
    # depth maps carry no colour: one channel; RGB has colour where the shapes are
    assert (a.images["rgb"].std(1) > 0.1).any()
    assert a.answers[3] in ("leftmost", "rightmost")
    assert not np.array_equal(make_scenes(40, seed=4).images["depth"], a.images["depth"])
    with pytest.raises(ValueError, match="types must be names from"):
        make_scenes(4, 0, types=("size",))


def test_sample_folders_round_trip_and_refuse_bad_samples(tmp_path):
    import json

    from PIL import Image

    from mixlab.vision_mm.mop.data import read_samples, write_samples

    scenes = make_scenes(6, seed=0)
    back = read_samples(write_samples(tmp_path / "d", scenes, ("rgb", "depth")), ("rgb", "depth"))
    assert back.answers == scenes.answers
    everything = read_samples(write_samples(tmp_path / "e", scenes))
    assert set(everything.images[0]) == {"rgb", "depth", "edge"}
    assert everything.images[0]["edge"].max() == 1.0  # the outlines of the visible shapes
    np.testing.assert_array_equal(back.images[2]["depth"], scenes.images["depth"][2])
    # a user's folder: PNG files, one sample with RGB only
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.zeros((32, 32), dtype=np.uint8)).save(tmp_path / "b.png")
    rows = [{"modalities": {"rgb": "a.png", "depth": "b.png"}, "question": "q", "answer": "a"},
            {"modalities": {"rgb": "a.png"}, "question": "q", "answer": "a"}]  # fmt: skip
    (tmp_path / "data.jsonl").write_text("\n".join(map(json.dumps, rows)))
    samples = read_samples(tmp_path)
    assert samples.images[0]["rgb"].shape == (3, 32, 32)
    assert samples.images[0]["depth"].shape == (1, 32, 32)
    assert samples.modality_rows("depth") == [0]
    for bad, message in [
        ({"modalities": {}, "question": "q", "answer": "a"}, "needs at least one modality"),
        (
            {"modalities": {"sonar": "a.png"}, "question": "q", "answer": "a"},
            "unknown modality 'sonar'",
        ),
        ({"modalities": {"rgb": "a.png"}, "answer": "a"}, "'question' must be text"),
    ]:
        (tmp_path / "data.jsonl").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            read_samples(tmp_path, ("rgb", "depth"))


def test_encoder_pretraining_is_seeded_unpaired_and_freezes_the_trunk():
    from mixlab.vision_mm.mop.bases import EncoderSpec, pretrain_encoder

    spec = EncoderSpec(dim=16, depth=1, heads=2, scenes=24, test_scenes=12, steps=4, batch_size=8)
    encoder, accuracy = pretrain_encoder(spec)
    again, _ = pretrain_encoder(spec)
    assert set(accuracy) == {"rgb", "depth"}
    assert all(0 <= a <= 1 for a in accuracy.values())
    assert not any(p.requires_grad for p in encoder.trunk.parameters())
    assert all(p.requires_grad for p in encoder.tokenizers.parameters())
    for a, b in zip(encoder.state_dict().values(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)


def test_questions_encode_with_labels_on_the_answer_only_and_score_by_exact_match():
    from mixlab.vision_mm.mop.scenes import vocabulary
    from mixlab.vision_mm.mop.text import answer_hits, encode_qa, word_tokenizer

    tokenizer = word_tokenizer(vocabulary())
    scenes = make_scenes(8, seed=1)
    encoded = encode_qa(tokenizer, scenes.questions, scenes.answers)
    assert tokenizer.unk_token_id not in encoded.input_ids
    for i in range(8):
        labelled = encoded.labels[i][encoded.labels[i] != -100].tolist()
        assert tokenizer.decode(labelled) == f"{scenes.answers[i]} </s>"
    perfect = torch.nn.functional.one_hot(encoded.input_ids.roll(-1, 1), len(tokenizer)).float()
    assert answer_hits(perfect, encoded.labels).all()
    wrong = perfect.clone()
    wrong[0, :, :] = 0
    assert answer_hits(wrong, encoded.labels).tolist() == [False] + [True] * 7


def test_the_toy_lm_learns_the_answer_format_from_text():
    from mixlab.vision_mm.mop.bases import LMSpec, pretrain_lm

    lm, tokenizer, blind = pretrain_lm(
        LMSpec(width=32, depth=1, heads=2, examples=200, steps=60, batch_size=32)
    )
    assert lm.config.vocab_size == len(tokenizer)
    # the blind prior: counts and depth order guessed, colours and shapes at chance (about 1/3 overall)
    assert 0.2 < blind < 0.6


def test_benchmark_connectors_hand_the_lm_the_same_tokens():
    from mixlab.vision_mm.mop.profile import CONNECTORS, build, hidden_states, time_connectors

    states = hidden_states("toy", 2)
    prefixes = {kind: build(kind, "toy")(states).prefix.shape for kind in CONNECTORS}
    assert set(prefixes.values()) == {(2, 32, 64)}
    times = time_connectors("toy", 1, backward=True, repeats=1)
    assert set(times) == set(CONNECTORS)
    assert all(t > 0 for t in times.values())
