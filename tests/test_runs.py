"""A run as a Lightning user reads it through the CLI: checkpoint paths checked before Lightning
reads them, one log folder per training run (evaluations inside it, under their own names),
predictions beside it, one results table, the checkpoint's own model where the command line sets
nothing, no folder left by a run that never trained, no sync_dist warnings."""

import glob
import os
import subprocess
import sys

import pytest
import torch

from rspo_lightning.checkpointing import AtomicCheckpointIO
from rspo_lightning.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.path.join(ROOT, "configs", "quickstart.yaml")
TINY = [
    "--config",
    QUICK,
    "--trainer.max_epochs",
    "1",
    "--data.iterations_per_epoch",
    "2",
    "--data.groups_per_iteration",
    "2",
    "--data.group_size",
    "2",
    "--data.num_val_tasks",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--data.env.kwargs",
    '{"task_types": ["pick_and_place"], "num_receptacles": 4, "max_steps": 3}',
    "--model.policy.tiny.hidden_size",
    "32",
    "--model.policy.tiny.intermediate_size",
    "64",
    "--model.rollout.constrained_decoding",
    "false",
    "--model.rollout.max_new_tokens",
    "6",
]


def _cli(capsys, *args) -> tuple[int, str, str]:
    """``rspo-lightning ARGS`` in this process: exit code, stdout, stderr."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def _damaged(tmp_path, kind: str) -> str:
    io = AtomicCheckpointIO()
    io.save_checkpoint(
        {"state_dict": {"w": torch.zeros(64, 64)}, "hyper_parameters": {}}, str(tmp_path / "iteration=1.ckpt")
    )
    path = str(tmp_path / f"{kind}.ckpt")
    if kind == "text":
        open(path, "w").write("not a checkpoint\n")
    elif kind == "empty":
        open(path, "w").close()
    elif kind == "truncated":
        data = open(tmp_path / "iteration=1.ckpt", "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    else:  # a whole file whose sidecar does not match
        io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, path)
        open(path + ".sha256", "w").write("0" * 64 + f"  {kind}.ckpt\n")
    return path


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
@pytest.mark.parametrize("kind", ["text", "empty", "truncated", "sidecar"])
def test_a_damaged_checkpoint_path_is_refused_before_lightning_reads_it(tmp_path, capsys, kind, subcommand):
    path = _damaged(tmp_path, kind)
    code, out, err = _cli(
        capsys, subcommand, *TINY, "--trainer.default_root_dir", str(tmp_path / "runs"), "--ckpt_path", path
    )
    assert code != 0
    assert path in err and "iteration=1.ckpt" in err  # the file, and the other checkpoint of its folder
    for torch_text in ("KeyError", "EOFError", "PytorchStreamReader", "Traceback"):
        assert torch_text not in err + out, (torch_text, err[-2000:])
    assert not (tmp_path / "runs").exists()


def _steps(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_run_and_its_evaluations_live_in_one_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    root = ["--trainer.default_root_dir", str(runs)]
    code, out, err = _cli(capsys, "validate", *TINY, *root, "--ckpt_path", "last")
    assert code != 0 and f"no checkpoint in {runs / 'quickstart' / 'checkpoints'} to validate" in err
    code, out, err = _cli(capsys, "fit", *TINY, *root, "--ckpt_path", "last")
    assert code == 0, err[-3000:]
    assert [line for line in out.splitlines() if "--ckpt_path last" in line] == [
        f"--ckpt_path last: no checkpoint to resume in {runs / 'quickstart' / 'checkpoints'}; starting from the beginning"
    ]
    code, out, err = _cli(
        capsys, "fit", *TINY, *root, "--trainer.max_epochs", "2", "--ckpt_path", "last"
    )  # 2 more iterations
    assert code == 0, err[-3000:]
    run = runs / "quickstart"
    assert sorted(os.listdir(run)) == [
        ".checkpoints.lock",
        "checkpoints",
        "version_0",
    ]  # the resumed fit logged on in its run's folder
    steps = _steps(run / "version_0")
    assert steps["rollout/success_rate"] == [1, 2, 3, 4] and steps["val/success_rate"] == [0, 2, 4]
    assert "hp_metric" not in steps

    code, out, err = _cli(capsys, "validate", *TINY, *root, "--ckpt_path", "last")
    assert code == 0, err[-3000:]
    table = out[out.index("validate: agent A at iteration 4") :].splitlines()
    assert table[1].split() == ["metric", "val", "val_unseen"]  # each split once, a column each
    assert [row.split()[0] for row in table[2:5]] == ["score", "success_rate", "success_rate/pick_and_place"]
    assert "DataLoader" not in out and "step " not in out and "hp_metric" not in out
    code, out, err = _cli(capsys, "test", *TINY, *root, "--ckpt_path", "last")
    assert code == 0 and out[out.index("test: agent A") :].splitlines()[1].split() == ["metric", "test", "test_unseen"]
    for _ in range(2):
        code, out, err = _cli(capsys, "predict", *TINY, *root, "--ckpt_path", "last")
        assert code == 0, err[-3000:]
        assert "predict valid_seen: 2 episodes, success rate 0.000, score 0.000, written to" in out
    assert sorted(os.listdir(run)) == [".checkpoints.lock", "checkpoints", "version_0"]
    assert {"validate", "test", "predict", "predictions"} <= set(os.listdir(run / "version_0"))
    assert sorted(os.listdir(run / "version_0" / "predictions")) == [
        "valid_seen-iteration4-2.jsonl",
        "valid_seen-iteration4.jsonl",
        "valid_unseen-iteration4-2.jsonl",
        "valid_unseen-iteration4.jsonl",
    ]
    assert _steps(run / "version_0" / "validate")["val/success_rate"] == [4]
    assert _steps(run / "version_0" / "test")["test_unseen/success_rate"] == [4]

    # a config of other settings (the GPU config, smollm2): the checkpoint's model and env where the command line sets nothing
    gpu = os.path.join(ROOT, "configs", "household", "gigpo.yaml")
    ckpt = str(run / "checkpoints" / "last.ckpt")
    code, out, err = _cli(
        capsys,
        "test",
        "--config",
        gpu,
        "--ckpt_path",
        ckpt,
        *root,
        "--trainer.accelerator",
        "cpu",
        "--trainer.precision",
        "32-true",
        "--data.num_val_tasks",
        "2",
        "--trainer.enable_progress_bar",
        "false",
    )
    assert code == 0, err[-3000:]
    assert "model.policy.source='tiny' (config: 'smollm2')" in out and '"num_receptacles": 4' in out
    assert out[out.index("test: agent A at iteration 4") :].splitlines()[1].split() == ["metric", "test", "test_unseen"]


def test_a_run_that_fails_before_its_first_iteration_leaves_no_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as info:  # one error line, exit 2 (docs/reliability.md)
        main(["fit", *TINY, "--trainer.default_root_dir", str(runs), "--model.policy.source", str(tmp_path / "absent")])
    assert info.value.code == 2 and "is not an existing directory" in capsys.readouterr().err
    assert not glob.glob(str(runs / "**" / "*"), recursive=True)


def test_no_sync_dist_warning_where_torch_distributed_is_initialised(tmp_path):
    """A single-process vLLM engine initialises torch.distributed (world size 1): the held-out
    means, already all-rank, are logged so Lightning has nothing to warn about."""
    script = f"""
import sys, warnings, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", world_size=1, rank=0)
from rspo_lightning.cli import main
with warnings.catch_warnings(record=True) as caught:  # the filters in force: what a user would be shown
    main(["fit", *{TINY!r}, "--trainer.default_root_dir", {str(tmp_path)!r}])
print("SYNC_DIST_WARNINGS", sum("sync_dist" in str(w.message) for w in caught))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SYNC_DIST_WARNINGS 0" in proc.stdout and "sync_dist" not in proc.stderr
    assert "litlogger" not in proc.stdout + proc.stderr


def test_the_logprob_mismatch_is_logged_in_an_iteration_where_nothing_trains(tmp_path):
    """All advantages 0 (no win, no invalid action under constrained decoding, no penalty): no row
    trains, and the rollout diagnostic is still there, over the rows played."""
    code = subprocess.run(
        [
            sys.executable,
            "-m",
            "rspo_lightning.cli",
            "fit",
            *TINY,
            "--trainer.default_root_dir",
            str(tmp_path),
            "--model.rollout.constrained_decoding",
            "true",
            "--model.algorithm.invalid_action_penalty",
            "0",
            "--model.algorithm.recompute_old_logprobs",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert code.returncode == 0, code.stderr[-3000:]
    steps = _steps(tmp_path / "quickstart" / "version_0")
    assert "train/policy_loss" not in steps  # nothing trained
    assert steps["rollout/logprob_mismatch_max"] == [1, 2] and steps["rollout/logprob_mismatch_mean"] == [1, 2]


def test_every_docs_path_named_in_readme_configs_and_code_exists():
    named = set()
    files = [
        os.path.join(ROOT, "README.md"),
        *glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True),
        *glob.glob(os.path.join(ROOT, "rspo_lightning", "**", "*.py"), recursive=True),
        *glob.glob(os.path.join(ROOT, "benchmarks", "*.py")),
        *glob.glob(os.path.join(ROOT, "docs", "*.md")),
    ]
    import re

    for path in files:
        for ref in re.findall(r"(?<![\w/.])(docs/[\w./-]+\.(?:md|json|png))", open(path).read()):
            named.add((ref, os.path.relpath(path, ROOT)))
    assert len(named) > 10
    missing = sorted((ref, where) for ref, where in named if not os.path.exists(os.path.join(ROOT, ref)))
    assert not missing, missing
