"""Mix-Opt's config ranges, the CLI's checks before work, damaged files (one line, exit 2) and the
regime check."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import DDPMScheduler

from mixlab.shared import Claim, Result
from mixlab.shared.checkpoint import save_state
from mixlab.shared.files import CheckpointError
from mixlab.vision_mm.mix_opt import MixOptConfig, MixOptTrainer, add_lora, build_unet, save_lora
from mixlab.vision_mm.mix_opt.config import BACKGROUND_NAMES, CAPTION_WORDS, Config
from mixlab.vision_mm.mix_opt.formats import SIDECAR_NAME, WEIGHT_NAME, lora_file
from mixlab.vision_mm.mix_opt.lora import load_lora
from mixlab.vision_mm.mix_opt.schedule import make_schedule

SCRIPT = Path(sys.executable).with_name("mixlab-vision")


def console(*args: str | Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """``mixlab-vision`` in a subprocess with an empty model cache at ``cache``."""
    env = {**os.environ, "MIXLAB_CACHE": str(cache), "MIXLAB_DEBUG": ""}
    return subprocess.run(
        [str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )


def one_line(stderr: str, *names: object) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for name in names:
        assert str(name) in lines[0], lines[0]
    return lines[0]


# --- config -----------------------------------------------------------------------------------


def test_config_refuses_values_outside_its_ranges():
    # (nan/inf in every float field and 0/-1 in every int field: tests/test_methods.py)
    for overrides, name in [
        ({"guidance": math.nan}, "guidance"),
        ({"guidance": 0.5}, "guidance"),
        ({"t0": 1.5}, "t0"),
        ({"p_min": -0.1}, "p_min"),
        ({"kappa": -1.0}, "kappa"),
        ({"tune_bp_lrs": (0.0, 1e-3, 3e-3, 1e-2)}, "tune_bp_lrs"),
        ({"tune_zo_lrs": (0.01, 0.02)}, "tune_zo_lrs"),  # fewer candidates than the BP modes
        ({"tune_low_resolutions": (16, 30)}, "tune_low_resolutions"),
        ({"tune_low_resolutions": (16, 64)}, "tune_low_resolutions"),
        ({"pretrain_low_share": 1.0}, "pretrain_low_share"),
        ({"base_channels": (8, 12)}, "base_channels"),
        ({"base_channels": (32,)}, "base_channels"),
        ({"resolution": 30}, "resolution"),
        ({"low_resolution": 64}, "low_resolution"),
        ({"systems": ("bp_high", "mix_opt")}, "systems"),
        ({"systems": ("sgd",)}, "systems"),
        ({"subject_background": "on_moon"}, "subject_background"),
        ({"steps": True}, "steps"),
    ]:
        with pytest.raises(ValueError, match=name):
            Config(**overrides)
    small = {"base_channels": [8, 16], "resolution": 16, "low_resolution": 8,
             "tune_low_resolutions": (8, 12), "memory_resolution": 32}  # fmt: skip
    assert Config(**small).base_channels == (8, 16)


def test_light_constants_match_the_data_module():
    from mixlab.vision_mm.mix_opt.data import BACKGROUNDS, VOCABULARY

    assert tuple(BACKGROUNDS) == BACKGROUND_NAMES
    assert tuple(w for w in VOCABULARY if not w.startswith("<")) == CAPTION_WORDS


def test_registry_and_cli_import_no_heavy_module():
    code = (
        "import sys, mixlab.vision_mm.cli, mixlab.vision_mm.mix_opt.config as c; "
        "assert c.METHOD.run == 'mixlab.vision_mm.mix_opt.experiment:run'; "
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'diffusers', 'peft', 'safetensors', 'PIL', 'scipy')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_config_imports_nothing_of_the_trainer():
    """No import circle config ↔ model/schedule/settings/trainer (issue 63): the config module
    loads none of the package's other modules, and they load without it."""
    code = (
        "import sys, mixlab.vision_mm.mix_opt.config; "
        "print(sorted(m for m in sys.modules if m.startswith('mixlab.vision_mm.mix_opt.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['mixlab.vision_mm.mix_opt.config']"
    code = (  # nor does the trainer's side need the experiment's config
        "import sys, mixlab.vision_mm.mix_opt.settings, mixlab.vision_mm.mix_opt.schedule; "
        "print('mixlab.vision_mm.mix_opt.config' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# --- regime check -----------------------------------------------------------------------------


def _regime_cells(
    base: float, bp_high: float, *, recognised: float = 0.9, added_mib: float = 60.0
) -> list[dict]:
    modes = {
        mode: {"added_peak_bytes": added_mib * 2**20, "total_peak_bytes": 2 * added_mib * 2**20}
        for mode in ("bp_high", "bp_low", "zo_high")
    }
    return [
        {"part": "memory", "modes": modes},
        {"part": "recognition", "recognised": recognised},
        {"part": "train", "system": "base", "seed": 0, "subject_fidelity": base},
        {"part": "train", "system": "bp_high", "seed": 0, "subject_fidelity": bp_high},
    ]


def test_regime_needs_bp_high_to_beat_the_base_model_by_the_margin():
    from mixlab.vision_mm.mix_opt.config import ADAPT_MARGIN
    from mixlab.vision_mm.mix_opt.experiment import regime

    cells = _regime_cells
    assert ADAPT_MARGIN == 0.02
    today = regime(cells(0.610, 0.561))[1]  # the landed quick run: BP-high below the base model
    assert not today.holds
    assert "0.561" in today.evidence
    assert "0.61" in today.evidence
    memory = Claim.compare("Mix-Opt's peak training memory is below BP-high's", 1.0, "<", 2.0)
    quality = Claim.compare("Mix-Opt's subject fidelity is close to BP-high's", 1.0, ">", 0.0)
    gated = regime(cells(0.610, 0.561), [memory, quality])
    result = Result(metrics={"a": {"x": 1.0}}, claims=[memory, quality], regime=gated)
    assert [claim.state for claim in result.claims] == ["holds", "untested"]  # memory stays tested
    assert not regime(cells(0.61, 0.625))[1].holds  # within the margin
    assert regime(cells(0.61, 0.64))[1].holds
    two = [*cells(0.6, 0.7), *cells(0.6, 0.5)[2:]]
    two[-1]["seed"] = two[-2]["seed"] = 1
    both = regime(two)[1]
    assert not both.holds
    assert "2 of 2" in both.text


def test_regime_needs_a_recognisable_base_and_memory_above_the_floor():
    from mixlab.vision_mm.mix_opt.experiment import MEMORY_FLOOR_MIB, RECOGNISABLE, regime

    assert (RECOGNISABLE, MEMORY_FLOOR_MIB) == (0.8, 50.0)
    memory = Claim.compare("Mix-Opt's peak training memory is below BP-high's", 1.0, "<", 2.0)
    quality = Claim.compare("Mix-Opt's subject fidelity is close to BP-high's", 1.0, ">", 0.0)

    def states(**kwargs) -> list[str]:
        checks = regime(_regime_cells(0.6, 0.7, **kwargs), [memory, quality])
        result = Result(metrics={"a": {"x": 1.0}}, claims=[memory, quality], regime=checks)
        return [claim.state for claim in result.claims]

    assert all(check.holds for check in regime(_regime_cells(0.6, 0.7)))
    blobs = regime(_regime_cells(0.6, 0.7, recognised=0.79))[0]  # a base model drawing blobs
    assert not blobs.holds
    assert "0.79" in blobs.evidence
    assert states() == ["holds", "holds"]
    assert states(recognised=0.5) == ["holds", "untested"]
    assert states(added_mib=49.0) == ["untested", "holds"]


def test_quality_claims_are_judged_on_the_worst_seed():
    from mixlab.vision_mm.mix_opt.experiment import _paired_by_seed

    # Mix-Opt beats random mixing on the mean (0.55 > 0.5) but not on seed 1.
    fidelity = {"base": (0.4, 0.4), "bp_high": (0.6, 0.8), "zo_high": (0.45, 0.45),
                "random": (0.5, 0.5), "mix_opt": (0.7, 0.4), "bp_low": (0.3, 0.3)}  # fmt: skip
    edges = {"mix_opt": (0.5, 0.6), "random": (0.55, 0.5), "bp_low": (0.4, 0.4)}
    cells = [
        {"part": "train", "system": system, "seed": seed, "subject_fidelity": values[seed],
         "edge_iou": edges.get(system, (0.5, 0.5))[seed]}
        for system, values in fidelity.items()
        for seed in (0, 1)
    ]  # fmt: skip
    metrics = {system: {} for system in fidelity}
    _paired_by_seed(cells, metrics)
    mix = metrics["mix_opt"]
    assert mix["fidelity_over_random_min"] == pytest.approx(-0.1)
    assert mix["gain_share_of_bp_high_min"] == pytest.approx(0.0)  # seed 1 keeps none of 0.4
    assert mix["fidelity_over_zo_high_min"] == pytest.approx(-0.05)
    assert mix["distortion_over_bp_low_max"] == pytest.approx(-0.1)  # below BP-low on both
    assert mix["distortion_over_random_max"] == pytest.approx(0.05)
    assert all(value is None for value in metrics["random"].values())
    cells[0]["subject_fidelity"] = cells[2]["subject_fidelity"] = 0.4  # no BP-high gain on seed 0
    _paired_by_seed(cells, metrics)
    assert math.isnan(metrics["mix_opt"]["gain_share_of_bp_high_min"])


def _claim_inputs(zo_loss: float) -> tuple[list[dict], dict]:
    """Cells of every system on one seed and the memory rows the claims read: Mix-Opt keeps 90 %
    of BP-high's gain and distorts less than BP-low and random mixing; BP-low alone adapts and
    has Mix-Opt's memory (its larger mode); its matched run distorts as much as BP-low; the loss
    on the subject's photos is 1.0 un-personalized, 0.5 after BP-high and ``zo_loss`` after
    ZO-high."""
    fidelity = {"base": 0.4, "bp_high": 0.6, "bp_low": 0.5, "zo_high": 0.45, "random": 0.5,
                "mix_opt": 0.58, "bp_low_matched": 0.5}  # fmt: skip
    edges = {"mix_opt": 0.6, "random": 0.5, "bp_low": 0.4, "bp_low_matched": 0.4}
    losses = {"base": 1.0, "bp_high": 0.5, "zo_high": zo_loss}
    cells = [
        {"part": "train", "system": system, "seed": 0, "subject_fidelity": value,
         "edge_iou": edges.get(system, 0.7), "subject_loss": losses.get(system, 0.8)}
        for system, value in fidelity.items()
    ]  # fmt: skip
    memory = {"bp_high": (2.0, 1.0), "zo_high": (1.0, 0.5), "bp_low": (1.5, 0.3)}
    metrics = {
        system: dict(zip(("memory_vs_zo_high", "memory_vs_bp_high"),
                         memory.get(system, memory["bp_low"]), strict=True))
        for system in fidelity
    }  # fmt: skip
    return cells, metrics


def test_claims_are_judged_on_their_controls_and_premises():
    from mixlab.vision_mm.mix_opt.config import PROGRESS_SHARE
    from mixlab.vision_mm.mix_opt.experiment import claims

    found = claims(*_claim_inputs(0.9), Config())  # ZO-high: 20 % of BP-high's loss reduction
    assert [c.key for c in found] == [spec.key for spec in Config.CLAIMS]
    assert [c.control.system for c in found] == ["bp_low", "bp_low", "bp_low_matched", "random"]
    # BP-low alone has Mix-Opt's peak memory: vacuous; the matched BP-low run distorts as much
    # as BP-low, so Mix-Opt's lower distortion is not its shorter BP-low run
    assert [c.state for c in found] == ["vacuous", "holds", "holds", "holds"]
    assert not found[0].per_seed
    assert found[0].not_per_seed
    assert all(c.per_seed for c in found[1:])
    assert [p.holds for p in found[1].premises] == [True, True]
    # the matched run distorts less too: the distortion claim is vacuous
    cells, metrics = _claim_inputs(0.9)
    next(c for c in cells if c["system"] == "bp_low_matched")["edge_iou"] = 0.5
    assert claims(cells, metrics, Config())[2].state == "vacuous"
    # ZO-high lowers the loss by less than PROGRESS_SHARE of BP-high's reduction: the quality
    # claims say nothing about mixing the two modes
    stalled = claims(*_claim_inputs(1.0 - 0.5 * PROGRESS_SHARE * 0.9), Config())
    assert [c.state for c in stalled] == ["vacuous", "untested", "untested", "untested"]
    assert "ZO-high alone makes progress on its loss" in stalled[1].evidence
    assert claims(*_claim_inputs(1.0 - 0.5 * PROGRESS_SHARE * 1.1), Config())[1].state == "holds"


# --- CLI: checked before any work ---------------------------------------------------------------


def test_profile_batch_size_is_one_line_before_the_probe(tmp_path):
    done = console("mix-opt", "profile", "--batch-size", "-1", cache=tmp_path / "cache")
    assert done.returncode == 2
    one_line(done.stderr, "--batch-size must be an integer >= 1, got -1")
    assert "Traceback" not in done.stderr


def test_sample_missing_lora_is_refused_before_the_base_model(tmp_path):
    cache = tmp_path / "cache"
    done = console(
        "mix-opt", "sample", "--lora", tmp_path / "missing", "--out", tmp_path / "g.png",
        cache=cache,
    )  # fmt: skip
    assert done.returncode == 2
    one_line(done.stderr, tmp_path / "missing")
    assert not cache.exists()
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["profile", "--resolution", "30"], "--resolution must be a multiple"),
        (["profile", "--low-resolution", "0"], "--low-resolution must be an integer >= 1"),
        (["profile", "--low-resolution", "64"], "--low-resolution must be <= resolution"),
        (["profile", "--rank", "0"], "--rank"),
        (["profile", "--modes", "sgd"], "--modes must be one of"),
        (["profile", "--device", "tpu"], "--device must be auto, cpu or cuda"),
        (["profile", "--unet", "sdxl"], "--unet must be one of"),
        (
            ["profile", "--unet", "sd15", "--resolution", "36"],
            "multiple of the UNet's downsampling factor 8",
        ),
        (["sample", "--out", "{tmp}/g.png", "--guidance", "nan"], "--guidance"),
        (["sample", "--out", "{tmp}/g.png", "--per-prompt", "0"], "--per-prompt"),
        (["sample", "--out", "{tmp}/g.png", "--steps", "-1"], "--steps"),
        (["sample", "--out", "{tmp}/g.png", "--seed", "-1"], "--seed"),
        (["sample", "--out", "{tmp}/g.png", "--backgrounds", "on_moon"], "--backgrounds"),
        (["sample", "--out", "{tmp}/g.png", "--noun", "dog"], "--noun"),
        (["sample", "--out", "{tmp}/grid"], "must end in one of"),
        (["sample", "--out", "{tmp}/folder.png"], "is a folder"),
        (["sample", "--out", "{tmp}/file/g.png"], "is a file, not a folder"),
        (["personalize", "--out", "{tmp}/o", "--low-resolution", "14"], "--low-resolution"),
        (["personalize", "--out", "{tmp}/o", "--steps", "0"], "--steps"),
        (["personalize", "--out", "{tmp}/o", "--zo-lr", "nan"], "--zo-lr"),
        (["personalize", "--out", "{tmp}/o", "--bp-lr", "-1"], "--bp-lr"),
        (["personalize", "--out", "{tmp}/o", "--pretrain-steps", "0"], "--pretrain-steps"),
        (["personalize", "--out", "{tmp}/o", "--fields", "[1]"], "--fields"),
        (["personalize", "--out", "{tmp}/o", "--fields", '{"t0": 2}'], "t0"),
        (["personalize", "--out", "{tmp}/o", "--background", "on_moon"], "--background"),
        (["personalize", "--out", "{tmp}/o", "--images", "{tmp}/none"], "--images"),
        (["personalize", "--out", "{tmp}/file"], "is a file"),
        (["personalize", "--out", "{tmp}/o", "--schedule", "cosine"], "schedule must be one of"),
    ],
)
def test_cli_checks_every_option_before_work(args, message, tmp_path, monkeypatch, capsys):
    from mixlab.vision_mm.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("MIXLAB_CACHE", str(cache))
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "file").write_text("not a folder")
    argv = ["mix-opt", *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, message)
    assert not cache.exists()  # no model was loaded or pre-trained
    assert not (tmp_path / "o").exists()
    assert not (tmp_path / "g.png").exists()


# --- damaged LoRA adapters ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    unet = build_unet(16, (16, 32), 32)
    add_lora(unet, rank=2)
    folder = tmp_path_factory.mktemp("lora") / "lora"
    save_lora(unet, folder)
    return folder


def _edit_sidecar(folder: Path, change) -> Path:
    path = folder / SIDECAR_NAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _flip_a_byte(path: Path) -> Path:
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40  # inside the last tensor's data: the header still reads
    path.write_bytes(bytes(raw))
    return path


DAMAGES = {
    "truncated safetensors": lambda f: _truncate(f / WEIGHT_NAME),
    "sidecar key removed": lambda f: _edit_sidecar(f, lambda d: d.pop("rank")),
    "sidecar key of wrong type": lambda f: _edit_sidecar(f, lambda d: d.update(rank="2")),
    "sidecar number edited": lambda f: _edit_sidecar(f, lambda d: d.update(rank=3)),
    "tensor data edited": lambda f: _flip_a_byte(f / WEIGHT_NAME),
    "foreign file truncated": lambda f: (
        (f / SIDECAR_NAME).unlink(),
        _truncate(f / WEIGHT_NAME),
    )[1],
    "sidecar not JSON": lambda f: (f / SIDECAR_NAME).write_text("{not json") and f / SIDECAR_NAME,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_lora_is_one_line_exit_2(damage, lora_folder, tmp_path):
    folder = tmp_path / "lora"
    shutil.copytree(lora_folder, folder)
    named = DAMAGES[damage](folder)
    cache = tmp_path / "cache"
    done = console("mix-opt", "sample", "--lora", folder, "--out", tmp_path / "g.png", cache=cache)
    assert done.returncode == 2, done.stderr
    one_line(done.stderr, named)
    assert not cache.exists()
    assert not (tmp_path / "g.png").exists()


def test_lora_sidecar_round_trip_and_foreign_adapters(lora_folder, tmp_path):
    sidecar = json.loads((lora_folder / SIDECAR_NAME).read_text())
    assert sidecar["rank"] == 2
    assert sidecar["weight_name"] == WEIGHT_NAME
    assert lora_file(lora_folder) == lora_folder / WEIGHT_NAME
    foreign = tmp_path / "foreign"  # e.g. diffusers' save_lora_adapter: no sidecar of ours
    foreign.mkdir()
    shutil.copy(lora_folder / WEIGHT_NAME, foreign / WEIGHT_NAME)
    torch.manual_seed(0)
    unet = build_unet(16, (16, 32), 32)
    load_lora(unet, foreign)
    assert unet.peft_config["default"].r == 2
    (foreign / WEIGHT_NAME).write_bytes(b"\x08" + bytes(7) + b"{}garbage")
    with pytest.raises(CheckpointError, match=WEIGHT_NAME):
        load_lora(build_unet(16, (16, 32), 32), foreign)


# --- damaged training checkpoints (personalize --resume) ----------------------------------------


def cli_trainer_config(steps: int) -> MixOptConfig:
    """What ``personalize --steps <steps>`` trains with (all other options at their defaults)."""
    return MixOptConfig(
        resolution=32, low_resolution=16, steps=steps, batch_size=4,
        schedule=make_schedule("mix_opt"), bp_lr=1e-3, zo_lr=0.05, zo_eps=1e-2, seed=0,
        checkpoint_every=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """An ``--out`` folder holding the checkpoint of a 2-step personalize run (a tiny UNet)."""
    torch.manual_seed(0)
    unet = build_unet(32, (16, 32), 32)
    add_lora(unet, rank=2)
    images, text = torch.rand(4, 3, 32, 32) * 2 - 1, torch.randn(4, 3, 32)
    out = tmp_path_factory.mktemp("personalize") / "out"
    MixOptTrainer(unet, DDPMScheduler(), images, text, cli_trainer_config(2)).train(
        out / "checkpoints"
    )
    return out


def _edit_state(sidecar: Path, change) -> Path:
    data = json.loads(sidecar.read_text())
    change(data["state"])
    sidecar.write_text(json.dumps(data))
    return sidecar


CHECKPOINT_DAMAGES = {
    "truncated safetensors": lambda s: _truncate(s.with_suffix(".safetensors")),
    "key removed": lambda s: _edit_state(s, lambda d: d.pop("step")),
    "key of wrong type": lambda s: _edit_state(s, lambda d: d.update(step="2")),
    "number edited": lambda s: _edit_state(s, lambda d: d.update(step=1)),
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGES))
def test_damaged_resume_checkpoint_is_one_line_exit_2(damage, run_folder, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(run_folder, out)
    (sidecar,) = (out / "checkpoints" / "checkpoints").glob("step_*.json")
    named = CHECKPOINT_DAMAGES[damage](sidecar)
    cache = tmp_path / "cache"
    done = console("mix-opt", "personalize", "--out", out, "--steps", "2", "--resume", cache=cache)
    assert done.returncode == 2, done.stderr
    one_line(done.stderr, named)
    assert not cache.exists()  # refused before the base model loads


def test_resume_under_other_settings_is_refused_before_work(
    run_folder, tmp_path, monkeypatch, capsys
):
    from mixlab.vision_mm.cli import main

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    argv = ["mix-opt", "personalize", "--out", str(run_folder), "--steps", "3", "--resume"]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, "other values of ['steps']")
    assert not (tmp_path / "cache").exists()


def test_trainer_refuses_a_checkpoint_that_does_not_fit(run_folder):
    from mixlab.shared.checkpoint import Checkpointer

    step, state = Checkpointer(run_folder / "checkpoints", resume=True).load_latest()
    torch.manual_seed(0)
    unet = build_unet(32, (16, 32), 32)
    add_lora(unet, rank=3)  # another rank: other shapes
    images, text = torch.rand(4, 3, 32, 32) * 2 - 1, torch.randn(4, 3, 32)
    trainer = MixOptTrainer(unet, DDPMScheduler(), images, text, cli_trainer_config(2))
    with pytest.raises(CheckpointError, match="another rank"):
        trainer.load(state, "step.json")
    with pytest.raises(CheckpointError, match="step.json"):
        trainer.load({**state, "history": []}, "step.json")
    assert step == 2


# --- damaged cache entries (the pre-trained base model) -----------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "foreign", "edited"])
def test_damaged_cached_base_model_is_one_line_exit_2(damage, tmp_path, monkeypatch, capsys):
    from mixlab.vision_mm.cli import main
    from mixlab.vision_mm.mix_opt import model

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    spec = model.model_spec(Config(pretrain_steps=7))  # what `sample --pretrain-steps 7` loads
    key = json.dumps(model._cache_key(spec))
    monkeypatch.setattr(model, "_pretrain", lambda *args: None)  # the entry, untrained
    model.pretrained_model(spec)
    (folder,) = (tmp_path / "cache" / "mix_opt").glob("shapes-unet-*")
    path = folder / "model"
    if damage == "foreign":  # intact files of another model
        encoder = model.CaptionEncoder(spec.text_dim)
        state = {"unet": {"w": torch.zeros(2)}, "encoder": encoder.state_dict(), "key": key}
        save_state(state, path)
    elif damage == "truncated":
        _truncate(path.with_suffix(".safetensors"))
    elif damage == "edited":
        data = json.loads(path.with_suffix(".json").read_text())
        data["state"]["key"] = key.replace('"steps": 7', '"steps": 8')
        path.with_suffix(".json").write_text(json.dumps(data))

    def pretrains(*args):
        raise AssertionError("a damaged entry must not be trained again")

    monkeypatch.setattr(model, "_pretrain", pretrains)
    argv = ["mix-opt", "sample", "--out", str(tmp_path / "g.png"), "--pretrain-steps", "7"]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, folder.name, "delete the folder")
    assert not (tmp_path / "g.png").exists()


def test_personalize_then_sample_on_a_tiny_base(tmp_path, monkeypatch, capsys):
    from mixlab.vision_mm.cli import main
    from mixlab.vision_mm.mix_opt import model

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))

    def tiny_base(spec=None, device="cpu"):  # instead of pre-training the real one
        torch.manual_seed(0)
        unet, encoder = build_unet(32, (8, 16), 16), model.CaptionEncoder(16)
        return unet.requires_grad_(False).eval(), encoder.requires_grad_(False).eval()

    monkeypatch.setattr(model, "pretrained_model", tiny_base)
    out = tmp_path / "run"
    argv = ["mix-opt", "personalize", "--out", str(out), "--steps", "2", "--batch-size", "2"]
    assert main([*argv, "--schedule", "random", "--fields", '{"p": 0.5}']) == 0
    assert json.loads((out / "lora" / SIDECAR_NAME).read_text())["rank"] == 4
    assert len(json.loads((out / "history.json").read_text())) == 2
    grid = tmp_path / "grid.png"
    argv = ["mix-opt", "sample", "--lora", str(out / "lora"), "--out", str(grid)]
    assert main([*argv, "--per-prompt", "1", "--steps", "1", "--backgrounds", "on_white"]) == 0
    assert grid.exists()
    assert "wrote" in capsys.readouterr().out
