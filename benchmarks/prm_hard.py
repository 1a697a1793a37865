"""The learned process reward of the hard Household setting (issue 21): fit SPA-RL's progress model
on won and lost episodes of a trained agent, measure how well its predicted return ranks held-out
episodes, and keep it where the study's ``grpo_rspo_prm`` run (B on the PRM) finds it.

    python benchmarks/prm_hard.py --ckpt runs/rspo_study/hard/grpo/seed1/checkpoints/last.ckpt

Steps (README "RSPO with a learned process reward", on the study's hard setting):

0. export the checkpoint (a GRPO run of the study) to a policy directory;
1. record ``--samples`` episodes per task on ``--tasks`` train tasks at temperature 1 (won and
   lost), and as many on the valid_seen tasks (never seen by the PRM fit);
2. fit ``configs/household/prm.yaml`` on the train episodes;
3. rank the held-out valid_seen episodes by the PRM's predicted return Σ_t c_t: ROC AUC of won
   against lost, Pearson correlation with the final subgoal progress over all episodes and over
   the lost ones alone (good and bad failures: what B's dense reward must tell apart), and the
   same for minus the turn count (a length-only predictor: a win ends the episode early, so it
   is the baseline a PRM must beat);
4. check that a fresh tiny policy of the setting (what every study run starts from) has the
   tokenizer the PRM reads (the PRM reads the episodes' token ids);
5. copy the PRM to ``--prm-out`` (tracked, ~1 MB) and write ``--record``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from rspo_study import HARD  # noqa: E402


def cli(*args: str, log: Path) -> None:
    """``rspo-lightning <args>`` as a child process (its output to ``log``); raises on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with open(log, "w") as out:
        rc = subprocess.call(
            [sys.executable, "-m", "rspo_lightning.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    if rc != 0:
        raise SystemExit(f"rspo-lightning {args[0]} failed (exit {rc}); see {log}")


def record_episodes(policy: Path, split: str, tasks: int, samples: int, out: Path, log: Path) -> Path:
    path = out / f"{split}.jsonl"
    if not path.exists():
        cli(
            "predict",
            "--config",
            str(ROOT / "configs/compare/grpo.yaml"),
            f"--model.policy.source={policy}",
            f"--data.env.kwargs={json.dumps(HARD)}",
            f"--data.predict_splits=[{split}]",
            f"--data.predict_samples={samples}",
            f"--data.num_val_tasks={tasks}",
            "--model.val_temperature=1.0",
            f"--model.predict_path={path}",
            f"--trainer.default_root_dir={out / 'predict'}",
            "--trainer.enable_progress_bar=false",
            log=log,
        )
    return path


def rank(prm_dir: Path, episodes: list) -> dict:
    """How the PRM's predicted return (and, as a baseline, the turn count) ranks ``episodes``."""
    from rspo_lightning.prm import ProcessRewardModule, pearson, roc_auc

    prm = ProcessRewardModule.from_pretrained(str(prm_dir))
    predicted = []
    for i in range(0, len(episodes), 32):
        predicted += [sum(v) for v in prm.turn_values(episodes[i : i + 32])]
    won = [t.success for t in episodes]
    progress = [t.turns[-1].progress if t.turns else t.initial_progress for t in episodes]
    length = [-len(t.turns) for t in episodes]  # shorter = better: a win ends the episode early

    def auc(scores):
        return roc_auc([s for s, w in zip(scores, won) if w], [s for s, w in zip(scores, won) if not w])

    lost = [i for i, w in enumerate(won) if not w]  # what a dense reward must tell apart: good and bad failures

    def lost_corr(scores):
        return pearson([scores[i] for i in lost], [progress[i] for i in lost])

    result = {
        "episodes": len(episodes),
        "won": sum(won),
        "prm_auc": auc(predicted),
        "prm_progress_corr": pearson(predicted, progress),
        "prm_lost_progress_corr": lost_corr(predicted),
        "length_auc": auc(length),
        "length_progress_corr": pearson(length, progress),
        "length_lost_progress_corr": lost_corr(length),
        "lost_mean_turns": sum(len(episodes[i].turns) for i in lost) / max(len(lost), 1),
    }
    return {k: None if v != v else v for k, v in result.items()}  # NaN (e.g. a constant score) as JSON null


def same_tokenizer(prm_dir: Path) -> bool:
    """Whether a fresh tiny policy of the hard setting (``configs/compare/grpo.yaml``, what every
    study run starts from) has the vocabulary of the PRM's tokenizer."""
    import yaml
    from transformers import AutoTokenizer

    from rspo_lightning.build import build_models
    from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
    from rspo_lightning.critic import CriticConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.rollout import RolloutConfig

    model = yaml.safe_load((ROOT / "configs/compare/grpo.yaml").read_text())["model"]
    fresh = build_models(
        PolicyConfig(source="tiny", tiny=TinyModelConfig(**model["policy"]["tiny"])),
        AlgorithmConfig(estimator="grpo"),
        CriticConfig(),
        RolloutConfig(**model.get("rollout", {})),
        EnvConfig(kwargs=dict(HARD)),
    ).tokenizer
    prm = AutoTokenizer.from_pretrained(str(prm_dir), local_files_only=True)
    return fresh.get_vocab() == prm.get_vocab()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="a checkpoint of a hard-setting run (the policy that records)")
    p.add_argument("--work", default="runs/prm_hard", help="episodes, policy, PRM fit (untracked)")
    p.add_argument("--tasks", type=int, default=256, help="train tasks recorded (and valid_seen tasks: --val-tasks)")
    p.add_argument("--val-tasks", type=int, default=128)
    p.add_argument("--samples", type=int, default=8, help="episodes per task")
    p.add_argument("--epochs", type=int, default=10, help="PRM fit epochs")
    p.add_argument("--prm-out", default="docs/data/rspo_study/prm/hard", help="where the study runs find the PRM")
    p.add_argument("--record", default="docs/data/rspo_study/prm/hard.json")
    args = p.parse_args(argv)
    from rspo_lightning.export import export
    from rspo_lightning.trajectory_io import load_trajectories

    t0 = time.time()
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    policy = work / "policy"
    if not policy.exists():
        export(str(Path(args.ckpt).resolve()), str(policy))
    train = record_episodes(policy, "train", args.tasks, args.samples, work, work / "predict_train.log")
    held = record_episodes(policy, "valid_seen", args.val_tasks, args.samples, work, work / "predict_valid.log")
    fit_dir = work / "fit"
    prm_dir = fit_dir / "household_prm" / "version_0" / "prm"
    if not prm_dir.exists():
        cli(
            "fit",
            "--config",
            str(ROOT / "configs/household/prm.yaml"),
            f"--model.init_args.policy.source={policy}",
            f"--data.init_args.train_path={train}",
            f"--trainer.max_epochs={args.epochs}",
            f"--trainer.default_root_dir={fit_dir}",
            f"--trainer.logger.init_args.save_dir={fit_dir}",
            "--trainer.enable_progress_bar=false",
            log=work / "fit.log",
        )
    fit_line = next((ln for ln in (work / "fit.log").read_text().splitlines() if ln.startswith("prm:")), "")
    episodes, fitted_on = load_trajectories(str(held)), load_trajectories(str(train))
    record = {
        "setting": "hard",
        "ckpt": str(args.ckpt),
        "train_episodes": len(fitted_on),
        "train_won": sum(t.success for t in fitted_on),
        "fit_epochs": args.epochs,
        "fit_summary": fit_line,
        "held_out_valid_seen": rank(prm_dir, episodes),
        "fresh_tiny_policy_same_tokenizer": same_tokenizer(prm_dir),
        "wall_s_this_invocation": time.time() - t0,  # steps already done (files in --work) are skipped
    }
    out = (ROOT / args.prm_out).resolve()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(prm_dir, out)
    rec = (ROOT / args.record).resolve()
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
