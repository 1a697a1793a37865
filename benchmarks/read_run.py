"""Summarise a finished run from its TensorBoard events: validation at the start and the end,
training success, and throughput.

    python benchmarks/read_run.py runs/quickstart/version_0
"""

from __future__ import annotations

import sys


def main(run_dir: str) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag):
        return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []

    for tag in ["val/success_rate", "val_unseen/success_rate"]:
        s = series(tag)
        if s:
            print(f"{tag}: " + ", ".join(f"{step}:{v:.3f}" for step, v in s))
            print(f"{tag.replace('/', '_')}_start: {s[0][1]:.3f}")
            print(f"{tag.replace('/', '_')}_end: {s[-1][1]:.3f}")
    for tag in [
        "rollout/success_rate",
        "rollout/episode_len",
        "perf/rollout_s",
        "perf/update_s",
        "perf/rollout_tokens_per_s",
        "perf/update_tokens_per_s",
    ]:
        v = [x for _, x in series(tag)]
        if v:
            k = min(10, len(v))
            print(
                f"{tag}: mean {sum(v) / len(v):.2f}, first {k} {sum(v[:k]) / k:.2f}, last {k} {sum(v[-k:]) / k:.2f} ({len(v)} iterations)"
            )


if __name__ == "__main__":
    main(sys.argv[1])
