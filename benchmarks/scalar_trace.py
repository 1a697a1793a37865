"""Every logged scalar of one short fit (all keys but ``perf/*``, which are timings), as JSON; and
the comparison of two such traces. A refactor that claims "behaviour unchanged" runs the same
command before and after and compares (issue 45).

    python benchmarks/scalar_trace.py run  --config configs/quickstart.yaml --out before.json -- --trainer.max_epochs=2
    python benchmarks/scalar_trace.py diff before.json after.json      # exit 1 on any difference

One thread (``_runs.thread_env(1)``), the CLI in a subprocess, TensorBoard events read back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import ROOT, thread_env  # noqa: E402


def trace(run_dir: Path) -> dict[str, list[list[float]]]:
    """``{tag: [[step, value], ...]}`` of every scalar in the event files under ``run_dir`` but ``perf/*``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[list[float]]] = {}
    for events in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if not tag.startswith("perf/"):
                out.setdefault(tag, []).extend([float(e.step), float(e.value)] for e in acc.Scalars(tag))
    return dict(sorted(out.items()))


def differences(a: dict, b: dict) -> list[str]:
    """Every tag whose points differ between traces ``a`` and ``b`` (exact comparison)."""
    out = [f"{tag}: only in the first" for tag in sorted(set(a) - set(b))]
    out += [f"{tag}: only in the second" for tag in sorted(set(b) - set(a))]
    for tag in sorted(set(a) & set(b)):
        if a[tag] != b[tag]:
            first = next((i for i, (x, y) in enumerate(zip(a[tag], b[tag])) if x != y), min(len(a[tag]), len(b[tag])))
            out.append(f"{tag}: {len(a[tag])} vs {len(b[tag])} points, first difference at point {first}")
    return out


def run(configs: list[str], extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "rspo_lightning.cli",
            "fit",
            *(a for c in configs for a in ("--config", c)),
            *extra,
        ]
        cmd += [f"--trainer.logger.init_args.save_dir={tmp}", "--trainer.enable_checkpointing=false"]
        subprocess.run(cmd, cwd=ROOT, env=thread_env(1), check=True, stdout=subprocess.DEVNULL)
        return trace(Path(tmp))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--config", action="append", required=True, help="repeatable, as the CLI's")
    r.add_argument("--out", required=True)
    r.add_argument("extra", nargs="*", help="CLI overrides after --")
    d = sub.add_parser("diff")
    d.add_argument("first")
    d.add_argument("second")
    args = p.parse_args()
    if args.cmd == "run":
        points = run(args.config, args.extra)
        Path(args.out).write_text(json.dumps(points, indent=0))
        print(f"{args.out}: {len(points)} tags, {sum(map(len, points.values()))} points")
        return
    a, b = (json.loads(Path(f).read_text()) for f in (args.first, args.second))
    diffs = differences(a, b)
    print("\n".join(diffs) if diffs else f"identical: {len(a)} tags, {sum(map(len, a.values()))} points")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
