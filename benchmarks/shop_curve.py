"""Read a `rspo-lightning fit --config configs/shop/grpo.yaml` run: print the validation curve as a
markdown table and plot it (validation score and success, training rollouts) to a PNG.

    python benchmarks/shop_curve.py runs/shop_grpo/version_0 --out docs/shop_grpo.png

Shop's held-out split is named `valid`; it logs as `val/*` (runs made before that change logged
`val_valid/*`, which is read the same way).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _runs import read_events  # noqa: E402


def val_prefix(series: dict) -> str:
    """`val_valid` or `val`: whichever holds the validation score of this run."""
    for prefix in ("val", "val_valid"):
        if f"{prefix}/score" in series:
            return prefix
    raise SystemExit(f"no val_valid/score or val/score in the run; tags: {sorted(series)}")


def window_mean(series: dict[int, float], end: int, width: int = 10) -> float | None:
    """Mean of the training iterations `end - width + 1 .. end` (None when there are none)."""
    values = [v for step, v in series.items() if end - width < step <= end]
    return sum(values) / len(values) if values else None


def table(series: dict, prefix: str) -> list[str]:
    score, success = series[f"{prefix}/score"], series.get(f"{prefix}/success_rate", {})
    train_score, train_success = series.get("rollout/score", {}), series.get("rollout/success_rate", {})
    rows = [
        f"| iteration | `{prefix}/score` | `{prefix}/success_rate` | training `rollout/score` (10 it. before) "
        "| training `rollout/success_rate` (10 it. before) |",
        "|---|---|---|---|---|",
    ]
    for step in sorted(score):
        ts, tw = window_mean(train_score, step), window_mean(train_success, step)
        rows.append(
            f"| {step} | {score[step]:.3f} | {success.get(step, float('nan')):.3f} | "
            f"{'-' if ts is None else f'{ts:.3f}'} | {'-' if tw is None else f'{tw:.3f}'} |"
        )
    return rows


def plot(series: dict, prefix: str, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for tag, label, style in (
        (f"{prefix}/score", "validation score (mean WebShop reward)", "o-"),
        (f"{prefix}/success_rate", "validation success (reward = 1)", "s-"),
        ("rollout/score", "training rollouts: score", "-"),
        ("rollout/success_rate", "training rollouts: success", "-"),
    ):
        points = sorted(series.get(tag, {}).items())
        if points:
            xs, ys = zip(*points)
            ax.plot(
                xs,
                ys,
                style,
                ms=4,
                lw=2 if "o" in style or "s" in style else 0.8,
                alpha=1.0 if "o" in style or "s" in style else 0.5,
                label=label,
            )
    ax.set_xlabel("RL iteration")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="the TensorBoard version folder, e.g. runs/shop_grpo/version_0")
    parser.add_argument("--out", default=str(ROOT / "docs" / "shop_grpo.png"), help="where to write the plot")
    parser.add_argument("--title", default="GRPO, tiny Llama on rspo/Shop-v0 (configs/shop/grpo.yaml)")
    args = parser.parse_args()
    run = Path(args.run_dir)
    if not run.is_dir():
        raise SystemExit(f"run folder {str(run)!r} does not exist; pass the version folder of a fit run")
    series = read_events(run)["series"]
    prefix = val_prefix(series)
    print("\n".join(table(series, prefix)))
    plot(series, prefix, Path(args.out), args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
