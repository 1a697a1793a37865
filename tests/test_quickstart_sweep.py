"""benchmarks/quickstart_sweep.py: the summary table from records alone, and every variant's
overrides accepted by the CLI on top of configs/quickstart.yaml."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import quickstart_sweep as sweep  # noqa: E402


def _rec(variant, seed, seen, unseen, best, rollout_s, update_s):
    return {"variant": variant, "seed": seed, "end_seen": seen, "end_unseen": unseen, "best_seen": best,
            "rollout_s": rollout_s, "update_s": update_s}  # fmt: skip


def test_summary_from_records(tmp_path):
    for r in [
        _rec("a", 0, 0.4, 0.5, 0.6, 1.0, 2.0),
        _rec("a", 1, 0.6, 0.3, 0.6, 2.0, 3.0),
        _rec("b", 0, 0.2, 0.1, 0.3, 1, 1),
    ]:
        out = tmp_path / r["variant"] / f"seed{r['seed']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(r))
    rows = sweep.summarise(tmp_path).splitlines()
    # a: ends 0.4, 0.6 -> mean 0.5, sample std sqrt(2 * 0.1^2 / 1) = 0.141; unseen 0.5, 0.3 -> 0.4 ± 0.141;
    # seconds per iteration (1 + 2, 2 + 3) -> 4.0. b: one seed, std 0.
    assert rows[2] == "| a | 2 | 0: 0.400, 1: 0.600 | 0.500 ± 0.141 | 0.400 ± 0.141 | 0.600 ± 0.000 | 4.0 |"
    assert rows[3] == "| b | 1 | 0: 0.200 | 0.200 ± 0.000 | 0.100 ± 0.000 | 0.300 ± 0.000 | 2.0 |"


def test_every_variant_parses():
    expect = {
        "base": lambda c: True,
        "h256": lambda c: c["model"]["policy"]["tiny"]["hidden_size"] == 256,
        "ent01": lambda c: c["model"]["algorithm"]["entropy_coef"] == 0.01,
        "cliphigh": lambda c: c["model"]["algorithm"]["clip_eps_high"] == 0.28,
        "hist4": lambda c: c["model"]["rollout"]["history_window"] == 4,
        "group16": lambda c: (c["data"]["groups_per_iteration"], c["data"]["group_size"]) == (8, 16),
        "near": lambda c: c["model"]["rollout"]["template"] == "compact_near",
        "heads8": lambda c: (
            (c["model"]["policy"]["tiny"]["num_heads"], c["model"]["policy"]["tiny"]["hidden_size"]) == (8, 128)
        ),
        "l3": lambda c: c["model"]["policy"]["tiny"]["num_layers"] == 3,
        "gigpo_near": lambda c: (
            c["model"]["algorithm"]["estimator"] == "gigpo"
            and c["model"]["algorithm"]["estimator_kwargs"]["episode_stats"] == "steps"
            and c["model"]["rollout"]["template"] == "compact_near"
        ),
    }
    assert set(sweep.VARIANTS) == set(expect)
    for name, check in expect.items():
        cmd = [
            sys.executable,
            "-m",
            "rspo_lightning.cli",
            "fit",
            "--config",
            sweep.CONFIG,
            *sweep.COMMON,
            *sweep.VARIANTS[name],
        ]
        out = subprocess.run(cmd + ["--print_config"], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        config = yaml.safe_load(out.stdout)
        assert check(config), name
        # every variant but the *near ones keeps the sweep's compact prompt (COMMON), whatever the config ships
        near = name in ("near", "gigpo_near")
        assert config["model"]["rollout"]["template"] == ("compact_near" if near else "compact"), name
