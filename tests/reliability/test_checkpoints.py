"""Checkpoints as a Lightning user meets them: atomic writes wherever $TMPDIR is, a full disk,
corrupt files named at startup, SIGKILL + `--ckpt_path last` with a shipped config, honest
TensorBoard points, and step knobs that would not mean RL iterations refused."""

import errno
import glob
import os
import signal
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
import yaml

from rspo_lightning import checkpointing
from rspo_lightning.checkpointing import AtomicCheckpointIO, CheckpointError, load_checkpoint_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")


def _ckpt(value):
    return {"state_dict": {"w": torch.full((4,), float(value))}, "epoch": 0}


def test_atomic_save_writes_next_to_the_file_whatever_tmpdir_is(tmp_path, monkeypatch):
    other_fs = tmp_path / "elsewhere"  # stands for a tmpfs $TMPDIR
    other_fs.mkdir()
    monkeypatch.setenv("TMPDIR", str(other_fs))
    path = str(tmp_path / "ckpts" / "last.ckpt")
    (tmp_path / "ckpts").mkdir()
    orphan = path + ".tmp-424242"  # what a run killed mid-write leaves
    open(orphan, "wb").write(b"half a checkpoint")
    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(1), path)
    assert os.listdir(other_fs) == []
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["last.ckpt", "last.ckpt.sha256"]  # the orphan is gone
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["w"], torch.ones(4))


@pytest.mark.parametrize("fault", ["enospc", "killed"])
def test_a_failed_write_leaves_the_previous_checkpoint_loadable_and_no_truncated_file(tmp_path, monkeypatch, fault):
    path = str(tmp_path / "last.ckpt")
    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(1), path)
    real_save = torch.save

    def failing_save(obj, f):
        real_save(obj, f)
        f.truncate(100)  # half written
        if fault == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise KeyboardInterrupt  # stands for a kill between write and rename

    monkeypatch.setattr(checkpointing.torch, "save", failing_save)
    expected = CheckpointError if fault == "enospc" else KeyboardInterrupt
    with pytest.raises(expected) as info:
        io.save_checkpoint(_ckpt(2), path)
    if fault == "enospc":
        assert (
            "no space left" in str(info.value) and path in str(info.value) and "previous checkpoint" in str(info.value)
        )
    monkeypatch.setattr(checkpointing.torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "last.ckpt.sha256"]
    assert torch.equal(load_checkpoint_file(path)["state_dict"]["w"], torch.ones(4))


def _corrupt(path, how):
    data = open(path, "rb").read()
    if how == "truncated":
        open(path, "wb").write(data[: len(data) // 2])
    elif how == "random":
        open(path, "wb").write(os.urandom(len(data)))
    elif how == "text":
        open(path, "w").write("epoch: 3\nthis is not a checkpoint\n")
    elif how == "empty":
        open(path, "wb").close()
    elif how == "flipped":
        middle = len(data) // 2
        open(path, "wb").write(data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :])


@pytest.mark.parametrize(
    "how, what",
    [
        ("truncated", "checksum"),
        ("random", "checksum"),
        ("text", "checksum"),
        ("empty", "empty"),
        ("flipped", "checksum"),
    ],
)
def test_a_corrupt_checkpoint_fails_naming_the_file_and_the_fix(tmp_path, how, what):
    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(1), str(tmp_path / "iteration=3.ckpt"))
    path = str(tmp_path / "last.ckpt")
    io.save_checkpoint(_ckpt(2), path)
    _corrupt(path, how)
    with pytest.raises(CheckpointError) as info:
        io.load_checkpoint(path)
    msg = str(info.value)
    assert path in msg and what in msg and "iteration=3.ckpt" in msg and "weights_only=False" not in msg
    # without the sidecar (a checkpoint written elsewhere), torch's own failure is named the same way
    if how in ("truncated", "random", "text"):
        os.remove(path + ".sha256")
        with pytest.raises(CheckpointError, match="cannot be read as a PyTorch checkpoint") as info:
            io.load_checkpoint(path)
        assert path in str(info.value) and "weights_only=False" not in str(info.value)


# -- SIGKILL, then the README's resume command, with a shipped config ----------------------------

ARGS = [
    "--config",
    os.path.join(ROOT, "configs", "compare", "grpo_rspo.yaml"),
    "--trainer.max_epochs",
    "2",
    "--data.iterations_per_epoch",
    "3",
    "--trainer.callbacks.k",
    "1",
    "--data.groups_per_iteration",
    "2",
    "--data.group_size",
    "2",
    "--data.num_val_tasks",
    "2",
    "--model.policy.tiny.hidden_size",
    "32",
    "--model.policy.tiny.intermediate_size",
    "64",
    "--trainer.enable_progress_bar",
    "false",
]


def _fit(cwd, *extra, expect_kill=False):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "rspo_lightning.cli", "fit", *ARGS, *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if expect_kill:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _scalars(version_dir):
    """``{tag: {step: value}}`` as TensorBoard shows the folder (its purge of a killed run's
    points past the resumed step applied); every tag's steps strictly increasing."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(version_dir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == sorted(set(steps)), (tag, steps)  # no repeated or backwards point
        out[tag] = {e.step: e.value for e in acc.Scalars(tag)}
    return out


def test_sigkill_mid_epoch_then_ckpt_path_last_reproduces_the_run(tmp_path):
    full, crash = tmp_path / "full", tmp_path / "crash"
    full.mkdir(), crash.mkdir()
    _fit(full, "--trainer.default_root_dir", str(full / "elsewhere"))  # logs and checkpoints follow default_root_dir
    assert (
        not (full / "runs").exists()
        and (full / "elsewhere" / "compare_grpo_rspo" / "checkpoints" / "last.ckpt").exists()
    )
    # iterations (k = 1): 0 explore, 1 collect, 2 exploit | 3 explore, 4 collect, 5 exploit; killed as the
    # 6th starts (mid-epoch 2, B active) with a checkpoint every 2 iterations: the last one holds 4
    # iterations done, and the killed run had logged step 5 too (TensorBoard shows the resumed run's)
    _fit(
        crash,
        "--trainer.callbacks+=distributed_helpers.KillAt",
        "--trainer.callbacks.at=5",
        "--checkpoint.every_n_iterations=2",
        expect_kill=True,
    )
    assert _scalars(crash / "runs" / "compare_grpo_rspo" / "version_0")["rspo/phase"] == {
        1: 0.0,
        2: 1.0,
        3: 2.0,
        4: 0.0,
        5: 1.0,
    }
    assert (
        torch.load(crash / "runs" / "compare_grpo_rspo" / "checkpoints" / "last.ckpt", weights_only=True)[
            "rspo_iteration"
        ]
        == 4
    )
    ckpt_dir = crash / "runs" / "compare_grpo_rspo" / "checkpoints"
    assert (ckpt_dir / "last.ckpt").exists() and (ckpt_dir / "last.ckpt.sha256").exists()
    _fit(crash, "--ckpt_path", "last")  # the README's resume command
    # one TensorBoard run: the resumed fit logs on in the killed run's folder
    assert sorted(os.listdir(crash / "runs" / "compare_grpo_rspo")) == [".checkpoints.lock", "checkpoints", "version_0"]
    a = _scalars(full / "elsewhere" / "compare_grpo_rspo" / "version_0")
    b = _scalars(crash / "runs" / "compare_grpo_rspo" / "version_0")  # killed, then resumed
    keys = [k for k in a if k.startswith(("train/", "rollout", "rspo/", "val"))]
    assert "rollout/success_rate" in keys and "val/success_rate" in keys and "rspo/phase" in keys
    for k in keys:
        assert b[k] == a[k], k
    # every point belongs to the iteration it is plotted at: B's rollout metrics only at explore
    # iterations (steps 1 and 4 = iterations done after iterations 0 and 3), no loss at the collect
    # iterations (steps 2 and 5), the phase plotted every iteration
    assert set(a["rollout_b/success_rate"]) == {1, 4}
    assert set(a["rollout/success_rate"]) == {3, 6}  # A's rollouts: the exploit iterations
    assert not set(a.get("train/policy_loss", {})) & {2, 5} and not set(a.get("train/samples", {})) & {2, 5}
    assert a["rspo/phase"] == {1: 0.0, 2: 1.0, 3: 2.0, 4: 0.0, 5: 1.0, 6: 2.0}


def test_every_shipped_config_has_its_own_checkpoint_place_and_no_optimizer_step_knobs():
    """`--ckpt_path last` looks in <save_dir>/<logger name>/checkpoints (no version folder): two
    configs with one name would resume each other's runs."""
    places = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        cfg = yaml.safe_load(open(path)) or {}
        trainer = cfg.get("trainer") or {}
        if not trainer or "model" not in cfg:
            continue  # a trainer preset (configs/trainer/*.yaml) composed with another config
        logger = (trainer.get("logger") or {}).get("init_args", {})
        place = os.path.join(logger.get("save_dir", "runs"), logger.get("name", "rspo"), "checkpoints")
        assert place not in places, f"{path} and {places.get(place)} share {place}"
        places[place] = path
        assert trainer.get("max_steps", -1) == -1, path
        for cb in trainer.get("callbacks") or []:
            assert "every_n_train_steps" not in (cb.get("init_args") or {}), path
    assert len(places) > 10


def test_step_knobs_that_count_optimizer_steps_are_refused():
    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    env = EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3})

    def fit(**kw):
        m = AgentRLModule(
            policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)),
            env=env,
        )
        pl.Trainer(logger=False, enable_progress_bar=False, **kw).fit(
            m, AgentDataModule(env=env, val_splits=[], groups_per_iteration=1, group_size=2)
        )

    with pytest.raises(
        ValueError, match=r"max_steps \(5\) counts optimizer steps.*data.iterations_per_epoch x trainer.max_epochs"
    ):
        fit(max_steps=5)
    with pytest.raises(ValueError, match=r"every_n_train_steps=5.*IterationCheckpoint\(every_n_iterations=N\)"):
        fit(max_epochs=1, callbacks=[pl.callbacks.ModelCheckpoint(every_n_train_steps=5)])


def test_a_second_fit_of_a_run_whose_lock_is_held_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """One writer per run folder: the test holds the run's lock (as a live fit's rank 0 would); a
    fit of the same run stops at startup naming the holder and the ways out, and writes nothing."""
    from rspo_lightning.cli import main
    from rspo_lightning.runfiles import RunLock

    monkeypatch.chdir(tmp_path)
    lock = RunLock(tmp_path / "runs" / "quickstart" / "checkpoints")
    lock.acquire()
    try:
        args = ["fit", "--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--config"]
        args += [os.path.join(ROOT, "configs", "smoke.yaml"), "--trainer.default_root_dir", str(tmp_path / "runs")]
        with pytest.raises(SystemExit) as info:
            main(args)
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert info.value.code != 0 and "Traceback" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {os.getpid()}" in errors[0], err[-2000:]
    assert "--trainer.logger.init_args.name" in errors[0] and "--trainer.default_root_dir" in errors[0]
    assert sorted(os.listdir(tmp_path / "runs" / "quickstart")) == [".checkpoints.lock"]  # no version_N, no checkpoint
    # the kernel drops a dead holder's lock: a process that took it and was killed leaves it free
    code = f"from rspo_lightning.runfiles import RunLock; RunLock({str(tmp_path / 'runs' / 'quickstart' / 'checkpoints')!r}).acquire(); print('held')"
    holder = subprocess.Popen(
        [sys.executable, "-c", code + "; import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    lock.acquire()
    lock.release()


@pytest.fixture
def small_filesystem(tmp_path):
    """A real 2 MiB tmpfs (root and a mount namespace that allows it), unmounted afterwards."""
    where = tmp_path / "small"
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a 2 MiB tmpfs here ({proc.stderr.strip() or proc.returncode}); the faked-OSError test stands"
        )
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_a_real_full_disk_is_named_and_the_previous_checkpoint_stays(small_filesystem):
    path = str(small_filesystem / "last.ckpt")
    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(1), path)
    big = {"state_dict": {"w": torch.zeros(1_000_000)}, "epoch": 1}  # 4 MB into 2 MiB: torch's writer fails mid-file
    with pytest.raises(CheckpointError) as info:
        io.save_checkpoint(big, path)
    msg = str(info.value)
    assert "no space left on the device" in msg and path in msg and "previous checkpoint" in msg, msg
    assert sorted(os.listdir(small_filesystem)) == ["last.ckpt", "last.ckpt.sha256"]
    assert torch.equal(load_checkpoint_file(path)["state_dict"]["w"], torch.ones(4))


@pytest.mark.parametrize("sidecar", [b"", os.urandom(64), b"not a sum  last.ckpt\n"], ids=["empty", "random", "text"])
def test_an_unreadable_sidecar_is_refused_like_a_mismatched_one(tmp_path, sidecar):
    path = str(tmp_path / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint(_ckpt(1), path)
    open(path + ".sha256", "wb").write(sidecar)
    with pytest.raises(CheckpointError, match="unreadable or holds no SHA-256") as info:
        load_checkpoint_file(path)
    assert path in str(info.value) and "delete it to load unchecked" in str(info.value)


def test_a_missing_sidecar_of_our_checkpoint_loads_with_one_warning(tmp_path, caplog):
    path = str(tmp_path / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint({**_ckpt(1), "rspo_iteration": 3}, path)
    os.remove(path + ".sha256")
    with caplog.at_level("WARNING", logger="rspo_lightning.checkpointing"):
        assert load_checkpoint_file(path)["rspo_iteration"] == 3
        load_checkpoint_file(path)
    warned = [r.getMessage() for r in caplog.records if "no checksum file" in r.getMessage()]
    assert len(warned) == 1 and path in warned[0]


def test_a_folder_as_ckpt_path_means_its_last_ckpt_or_lists_what_it_holds(tmp_path, capsys):
    from rspo_lightning.cli import _checkpoint_in_folder

    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(1), str(tmp_path / "iteration=3.ckpt"))
    with pytest.raises(SystemExit):
        _checkpoint_in_folder(str(tmp_path))
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "without last.ckpt" in err and "iteration=3.ckpt" in err
    io.save_checkpoint(_ckpt(2), str(tmp_path / "last.ckpt"))
    assert _checkpoint_in_folder(str(tmp_path)) == str(tmp_path / "last.ckpt")


def test_a_read_only_folder_and_a_missing_parent_are_named(tmp_path):
    from rspo_lightning.runfiles import file_error_message

    where = tmp_path / "ro"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({proc.stderr.decode().strip() or proc.returncode})")
    try:
        with pytest.raises(
            CheckpointError, match=r"cannot write checkpoint .*last.ckpt: read-only file system"
        ) as info:
            AtomicCheckpointIO().save_checkpoint(_ckpt(1), str(where / "last.ckpt"))
        assert "--trainer.default_root_dir" in str(info.value)
    finally:
        subprocess.run(["umount", str(where)], check=False)
    # a parent that vanished under the run (the error torch wraps), named by the chain's errno
    try:
        open(tmp_path / "gone" / "x", "wb")
    except OSError as inner:
        wrapped = RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")
        wrapped.__context__ = inner
    assert "a folder on its way does not exist" in file_error_message(str(tmp_path / "gone" / "x"), wrapped)
