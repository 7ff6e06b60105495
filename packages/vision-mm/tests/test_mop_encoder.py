"""The shared encoder (issue 28, in progress): per-modality tokenizers in front of a toy ViT or a
tiny transformers CLIPVisionModel, HF's hidden-state layout, one tokenizer per forward, clear
errors for inputs that do not fit."""

import pytest
import torch

from mixlab.vision_mm.mop.encoder import SharedEncoder, toy_trunk
from mixlab.vision_mm.mop.probes import MixtureOfProbes

MODALITIES = {"rgb": (3, 32, 8), "depth": (1, 32, 8)}


def _tiny_clip():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, image_size=32, patch_size=8)  # fmt: skip
    return CLIPVisionModel(config)


@pytest.mark.parametrize("trunk", ["toy", "clip"])
def test_hidden_states_follow_hf_layout_and_feed_the_probes(trunk):
    torch.manual_seed(0)
    model = toy_trunk(32, depth=3) if trunk == "toy" else _tiny_clip().eval()
    encoder = SharedEncoder(model, MODALITIES)
    states = encoder.hidden_states("depth", torch.rand(2, 1, 32, 32))
    assert len(states) == encoder.num_hidden_states == 4
    assert states[-1].shape == (2, 17, 32)  # class token + 16 patches
    out = MixtureOfProbes(32, encoder.num_hidden_states, num_probes=2, queries=3)(states)
    assert out.prefix.shape == (2, 3, 32)


def test_clip_trunk_matches_clip_on_its_own_patch_embedding():
    """With CLIP's own embeddings as the tokenizer, the states equal CLIP's output_hidden_states."""
    torch.manual_seed(0)
    clip = _tiny_clip().eval()
    encoder = SharedEncoder(clip, {"rgb": (3, 32, 8)})
    tokenizer = encoder.tokenizers["rgb"]
    embeddings = getattr(clip, "vision_model", clip).embeddings
    with torch.no_grad():
        tokenizer.proj.load_state_dict(
            embeddings.patch_embedding.state_dict() | {"bias": torch.zeros(32)}
        )
        tokenizer.cls.copy_(embeddings.class_embedding[None, None])
        tokenizer.positions.copy_(embeddings.position_embedding.weight[None])
    pixels = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        ours = encoder.hidden_states("rgb", pixels)
        theirs = clip(pixel_values=pixels, output_hidden_states=True).hidden_states
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_single_modality_forward_calls_no_other_tokenizer():
    encoder = SharedEncoder(toy_trunk(32, depth=2), MODALITIES)
    called = []
    for name, tokenizer in encoder.tokenizers.items():
        tokenizer.register_forward_hook(lambda *_, name=name: called.append(name))
    encoder.hidden_states("rgb", torch.rand(1, 3, 32, 32))
    assert called == ["rgb"]


def test_inputs_that_do_not_fit_are_refused():
    encoder = SharedEncoder(toy_trunk(32, depth=2), MODALITIES)
    with pytest.raises(ValueError, match=r"input must be \[batch, 1, 32, 32\]"):
        encoder.hidden_states("depth", torch.rand(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"input must be \[batch, 3, 32, 32\]"):
        encoder.hidden_states("rgb", torch.rand(1, 3, 64, 64))
    with pytest.raises(ValueError, match="modality must be one of"):
        encoder.hidden_states("sonar", torch.rand(1, 1, 32, 32))
    with pytest.raises(ValueError, match="trunk must be"):
        SharedEncoder(torch.nn.Linear(2, 2), MODALITIES)


def _tiny_lm(kind: str):
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2))  # fmt: skip
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )


@pytest.mark.parametrize("lm_kind", ["llama", "gpt2"])
@pytest.mark.parametrize("trunk", ["toy", "clip"])
def test_mllm_trains_on_each_modality_alone_with_the_prefix_never_a_label(trunk, lm_kind):
    from mixlab.vision_mm.mop.model import PrivilegedMLLM

    torch.manual_seed(0)
    encoder = SharedEncoder(toy_trunk(32, depth=3) if trunk == "toy" else _tiny_clip(), MODALITIES)
    model = PrivilegedMLLM(
        encoder, MixtureOfProbes(32, 4, num_probes=2, queries=3), _tiny_lm(lm_kind)
    )
    ids = torch.randint(0, 50, (2, 5))
    labels = ids.clone()
    labels[:, :3] = -100
    for modality, channels in (("rgb", 3), ("depth", 1)):
        out = model(modality, torch.rand(2, channels, 32, 32), ids, labels=labels)
        assert out.logits.shape == (2, 5, 50)
        out.loss.backward()
    assert encoder.tokenizers["depth"].proj.weight.grad is not None
    assert all(
        p.grad is None for p in encoder.trunk.parameters()
    )  # the shared encoder stays frozen
    assert model.connector.probes[0].queries.grad is not None
    with pytest.raises(ValueError, match="one row per sample"):
        model("rgb", torch.rand(3, 3, 32, 32), ids)


def _tiny_mllm(connector: str = "mop"):
    from mixlab.vision_mm.mop.model import PrivilegedMLLM
    from mixlab.vision_mm.mop.probes import Resampler, RoutedResamplers

    encoder = SharedEncoder(toy_trunk(32, depth=3), MODALITIES)
    module = {"mop": lambda: MixtureOfProbes(32, 4, num_probes=2, queries=3),
              "resampler": lambda: Resampler(32, queries=3),
              "routed": lambda: RoutedResamplers(32, experts=2, queries=3)}[connector]()  # fmt: skip
    return PrivilegedMLLM(encoder, module, _tiny_lm("llama"))


@pytest.mark.parametrize(
    "system", ["unimodal", "dropout", "resampler", "mop-nodis", "mop-x", "distill", "onellm"]
)
def test_every_system_trains_one_step_on_the_same_batch(system):
    from mixlab.vision_mm.mop.training import CONNECTORS, system_spec, training_loss

    torch.manual_seed(0)
    model = _tiny_mllm(CONNECTORS[system])
    teacher = _tiny_mllm() if system == "distill" else None
    ids = torch.randint(0, 50, (8, 5))
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    batch = {"images": {"rgb": torch.rand(8, 3, 32, 32), "depth": torch.rand(8, 1, 32, 32)},
             "input_ids": ids, "labels": labels}  # fmt: skip
    spec = system_spec(system, ("rgb", "depth"), deploy="rgb", privileged="depth")
    called = []
    for name, tokenizer in model.encoder.tokenizers.items():
        tokenizer.register_forward_hook(lambda *_, name=name: called.append(name))
    loss, logs = training_loss(
        model, batch, spec, generator=torch.Generator().manual_seed(1), teacher=teacher
    )
    loss.backward()
    assert torch.isfinite(loss)
    if system in ("unimodal", "distill"):
        assert set(called) == {"rgb"}  # the deployed modality alone
    else:
        assert set(called) == {"rgb", "depth"}
    assert ("dis" in logs) == (system == "mop-x")
    assert ("align" in logs) == (system in ("mop-x", "mop-nodis", "resampler"))
    assert ("distill" in logs) == (system == "distill")


def test_fit_resumes_from_its_checkpoint_to_the_same_weights(tmp_path):
    from mixlab.vision_mm.mop.training import fit, system_spec

    def batches(step):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 50, (4, 5), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, -1] = ids[:, -1]
        return {"images": {"rgb": torch.rand(4, 3, 32, 32, generator=g), "depth": torch.rand(4, 1, 32, 32, generator=g)},
                "input_ids": ids, "labels": labels}  # fmt: skip

    spec = system_spec("dropout", ("rgb", "depth"), deploy="rgb", privileged="depth")
    torch.manual_seed(0)
    whole = _tiny_mllm()
    history = fit(whole, batches, spec, 4, seed=1)
    assert len(history) == 4
    torch.manual_seed(0)
    killed = _tiny_mllm()

    def dies_at_step_two(step):
        if step == 2:
            raise KeyboardInterrupt
        return batches(step)

    with pytest.raises(KeyboardInterrupt):
        fit(
            killed,
            dies_at_step_two,
            spec,
            4,
            seed=1,
            checkpoint=str(tmp_path / "ckpt"),
            checkpoint_every=2,
        )
    torch.manual_seed(0)
    resumed = _tiny_mllm()
    resumed_history = fit(
        resumed, batches, spec, 4, seed=1, checkpoint=str(tmp_path / "ckpt"), checkpoint_every=2
    )
    assert len(resumed_history) == 2
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_paired_batches_are_a_function_of_the_step_and_accuracy_is_per_type():
    from mixlab.vision_mm.mop.text import EncodedQA
    from mixlab.vision_mm.mop.training import accuracy_by_type, paired_batches

    ids = torch.randint(0, 50, (10, 5))
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    encoded = EncodedQA(ids, torch.ones_like(ids), labels)
    images = {"rgb": torch.rand(10, 3, 32, 32), "depth": torch.rand(10, 1, 32, 32)}
    batches = paired_batches(images, encoded, 4, seed=0)
    first, again = batches(3), batches(3)
    torch.testing.assert_close(first["images"]["depth"], again["images"]["depth"])
    torch.testing.assert_close(first["input_ids"], again["input_ids"])
    scores = accuracy_by_type(
        _tiny_mllm(), "depth", images["depth"], encoded, ["a"] * 5 + ["b"] * 5, batch_size=3
    )
    assert set(scores) == {"a", "b", "all"}
    assert scores["all"] == pytest.approx((scores["a"] + scores["b"]) / 2)


@pytest.mark.parametrize("trunk", ["toy", "clip"])
def test_save_pretrained_round_trips_every_part(tmp_path, trunk):
    from mixlab.vision_mm.mop.model import PrivilegedMLLM

    torch.manual_seed(0)
    encoder = SharedEncoder(toy_trunk(32, depth=3) if trunk == "toy" else _tiny_clip(), MODALITIES)
    connector = MixtureOfProbes(32, 4, num_probes=2, queries=3, layers=[1, 3], combine="concat")
    model = PrivilegedMLLM(encoder, connector, _tiny_lm("llama")).eval()
    model.save_pretrained(tmp_path / "model")
    loaded = PrivilegedMLLM.from_pretrained(tmp_path / "model")
    ids = torch.randint(0, 50, (2, 5))
    images = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded("depth", images, ids).logits, model("depth", images, ids).logits
        )
    assert loaded.connector.layers == (1, 3)
    with pytest.raises(FileNotFoundError, match="no mop.json"):
        PrivilegedMLLM.from_pretrained(tmp_path)


def test_samples_train_only_the_modalities_they_have():
    from mixlab.vision_mm.mop.training import system_spec, training_loss

    torch.manual_seed(0)
    model = _tiny_mllm()
    ids = torch.randint(0, 50, (4, 5))
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    present = {
        "rgb": torch.tensor([True, True, True, False]),
        "depth": torch.tensor([False, True, True, True]),
    }
    batch = {"images": {"rgb": torch.rand(4, 3, 32, 32), "depth": torch.rand(4, 1, 32, 32)},
             "input_ids": ids, "labels": labels, "present": present}  # fmt: skip
    seen = []
    model.encoder.tokenizers["rgb"].register_forward_hook(
        lambda _m, args, _o: seen.append(len(args[0]))
    )
    for system in ("mop-x", "dropout"):
        spec = system_spec(
            system, ("rgb", "depth"), deploy="rgb", privileged="depth", symmetric=True
        )
        loss, _ = training_loss(model, batch, spec, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(loss)
    assert seen[0] == 3  # MoP-X: the three samples with RGB
    assert seen[1] <= 3  # dropout never picks a modality a sample lacks
    nothing = {**batch, "present": {m: torch.zeros(4, dtype=torch.bool) for m in present}}
    with pytest.raises(ValueError, match="no sample of the batch"):
        training_loss(
            model, nothing, system_spec("mop-x", ("rgb", "depth"), deploy="rgb", privileged="depth")
        )
