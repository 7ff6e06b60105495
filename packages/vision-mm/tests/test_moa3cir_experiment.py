"""The MoA3CIR experiment end to end at a tiny size (towers, cells, regime and claims), its
resume after a kill, and its config checks."""

from __future__ import annotations

import json

import pytest

from mixlab.vision_mm.moa3cir.config import Config

TINY = dict(n_seeds=2, one_phase_seeds=1, size=16, clip_width=16, clip_layers=1, clip_heads=2, embed_dim=16,
            context_length=16, tower_items=64, tower_triplets=64, tower_steps=4, classifier_steps=4,
            train_triplets=64, augment=32, test_queries=40, alignment_items=20, steps=4, batch_size=8,
            dim=16, heads=8, groups=4, shared_heads=4, projection_dim=32, hidden_dim=32, workers=1)  # fmt: skip


def test_experiment_runs_and_gates_claims_on_the_regime(cache):
    from mixlab.vision_mm.moa3cir.config import METHOD

    result = METHOD.execute(Config(**TINY), cache / "run")
    assert result.cache["state"] == "cold"  # an empty cache: the towers were trained
    assert len(result.cache["entries"]) == 5  # the towers and four feature sets
    assert not list((cache / "cache" / "moa3cir").glob(".*"))  # no checkpoint or partial left
    rows = result.metrics
    assert set(Config().systems) | {"towers/phase-1"} == set(rows)
    assert len({tuple(sorted(r)) for r in rows.values()}) == 1  # every row has the same keys
    assert rows["moa3cir"]["seeds"] == 2
    assert rows["one-phase"]["seeds"] == 1
    assert 0 <= rows["moa3cir"]["R@1"] <= rows["moa3cir"]["R@10"] <= rows["moa3cir"]["R@50"] <= 1
    assert 0 <= rows["moa3cir"]["nmi"] <= 1
    assert rows["moa3-dense"]["nmi"] is None
    # at this size nothing is learned: the regime fails and every claim is untested
    assert not all(check.holds for check in result.regime)
    assert [c.text[:3] for c in result.claims] == ["(0)", "(1)", "(2)", "(3)", "(4)"]
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.system for c in result.claims)
    assert not any(c.tested for c in result.claims)
    assert (cache / "run" / "recall.png").is_file()
    assert (cache / "run" / "routing.png").is_file()


def test_killed_mid_training_resumes_to_the_same_numbers(cache, monkeypatch):
    from mixlab.vision_mm.moa3cir import experiment, training

    config = Config(
        **{
            **TINY,
            "n_seeds": 1,
            "one_phase_seeds": 0,
            "systems": ("image-only", "combiner", "moa3cir"),
        }
    )
    whole = experiment.run(config, cache / "whole")
    real = training._rows

    def dies_at_step_three(count, batch_size, seed, step):
        if step == 3:  # the towers are cached: the combiner's phase 2, after step 2's checkpoint
            raise KeyboardInterrupt
        return real(count, batch_size, seed, step)

    monkeypatch.setattr(training, "_rows", dies_at_step_three)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, cache / "killed")
    assert (
        cache / "killed" / "training" / "combiner-0" / "checkpoints" / "step_00000002.json"
    ).is_file()
    monkeypatch.setattr(training, "_rows", real)
    resumed = experiment.METHOD.execute(config, cache / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # the first run's towers and features
    assert json.dumps(resumed.metrics, sort_keys=True) == json.dumps(whole.metrics, sort_keys=True)


def _cells(recall: dict[str, float]) -> list[dict]:
    """Cells of every system on three seeds (3, 4, 5): R@1 and R@10 per system from ``recall`` (0.5 for
    the others) on every attribute, material edits 0.2 higher for systems that read the
    descriptions, and the router's NMI for the routed systems."""
    from mixlab.vision_mm.moa3cir.catalogue import EDITABLE
    from mixlab.vision_mm.moa3cir.experiment import DESCRIBED

    done = []
    for seed in range(3, 6):
        for system in Config().systems:
            value = recall.get(system, 0.5) + 0.01 * (seed - 3)
            cell = {"system": system, "seed": seed, "R@1": value, "R@10": value}
            for attribute in EDITABLE:
                lift = 0.2 if attribute == "material" and system in DESCRIBED else 0.0
                cell[f"R@1_{attribute}"] = value + lift
            if system.startswith("moa3cir"):
                cell["nmi"] = 0.6
            done.append(cell)
    return done


def test_a_claim_the_control_also_passes_is_vacuous():
    from mixlab.vision_mm.moa3cir.experiment import claims

    config = Config()
    found = {c.key: c for c in claims(_cells({"moa3cir": 0.9, "moa3-dense": 0.8}), config)}
    controls = {key: claim.control.system for key, claim in found.items()}
    assert controls == {"beats_sum": "combiner-5tower", "beats_combiner": "sum-5tower and combiner-5tower",
                        "five_towers_beat_three": "sum-5tower and combiner-5tower",
                        "routing_tracks_attribute": "sum-5tower and moa3cir-unsupervised",
                        "level_without_descriptions": "sum"}  # fmt: skip
    # the five-tower sum and combiner stay level with the combiner and the three-tower model
    assert found["beats_sum"].state == "holds"
    assert found["beats_combiner"].state == "holds"
    assert found["five_towers_beat_three"].state == "holds"
    assert found["routing_tracks_attribute"].state == "holds"  # no router: the sum's NMI is 0
    assert "NMI(top group, edited attribute) 0.6 >= " in found["routing_tracks_attribute"].evidence
    assert "(seed 3)" in found["routing_tracks_attribute"].evidence  # the cells' seed, not an index
    recall = {"moa3cir": 0.9, "moa3-dense": 0.8, "sum-5tower": 0.95}
    summed = {c.key: c for c in claims(_cells(recall), config)}
    assert summed["beats_combiner"].state == "vacuous"  # the parameter-free sum beats it as well
    assert summed["five_towers_beat_three"].state == "vacuous"
    assert summed["routing_tracks_attribute"].state == "holds"
    assert summed["beats_sum"].state == "fails"  # 0.9 < 0.95 on every seed
    # a combiner that reads the descriptions as well as MoA3CIR, and a router that tracks the
    # attribute without supervision: the gains are not MoA³'s, nor the supervision's
    recall = {
        "moa3cir": 0.9,
        "moa3-dense": 0.8,
        "combiner-5tower": 0.92,
        "moa3cir-unsupervised": 0.9,
    }
    learned = {c.key: c for c in claims(_cells(recall), config)}
    assert learned["beats_sum"].state == "vacuous"
    assert learned["beats_combiner"].state == "vacuous"  # its also-control passes
    assert learned["five_towers_beat_three"].state == "vacuous"
    assert learned["routing_tracks_attribute"].state == "vacuous"


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="groups must be"):
        Config(heads=16, shared_heads=4, groups=5)
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("image-only", "combiner", "moa3cir", "blip"))
    with pytest.raises(ValueError, match="systems must be names including"):
        Config(systems=("image-only", "moa3cir"))
    with pytest.raises(ValueError, match="patch must be"):
        Config(patch=5)
    with pytest.raises(ValueError, match="one_phase_seeds must be"):
        Config(n_seeds=2, one_phase_seeds=3)
    with pytest.raises(ValueError, match="groups must be 4 .one router group per editable"):
        Config(heads=16, shared_heads=4, groups=2)  # the router is supervised by attribute
    Config(heads=16, shared_heads=4, groups=2, route_supervision=0.0)  # unsupervised: any G
    with pytest.raises(ValueError, match="route_supervision must be"):
        Config(route_supervision=-1.0)
