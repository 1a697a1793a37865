"""``rspo-lightning``: the Lightning CLI (subcommands fit / validate / test / predict).

``rspo-lightning fit --help`` is the reference manual: every argument of the RL module, its
data module and the callbacks below is typed and documented there. ``rspo-lightning export
--help``: agent A of a checkpoint as a Hugging Face directory (``rspo_lightning.export``).

Another LightningModule / DataModule (e.g. the SFT warm start) is chosen with
``--model CLASS`` / ``--data CLASS`` or a ``class_path`` in a config file; the CLI then switches
to Lightning's subclass mode (``--model.help CLASS`` documents that class).
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import json
import logging
import os
import re
import shutil
import sys

import yaml
from jsonargparse import Namespace
from jsonargparse._common import debug_mode_active
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from rspo_lightning import runtime  # noqa: F401  (filters Lightning's notices for every command, SFT and PRM fits too)
from rspo_lightning.callbacks import IterationCheckpoint, IterationProgressBar, TranscriptLogger
from rspo_lightning.checkpointing import CheckpointError, load_checkpoint_file, other_checkpoints
from rspo_lightning.export import SUMMARY as export_summary
from rspo_lightning.runfiles import RunLock, RunLockedError

DEFAULT_SAVE_DIR = "runs"  # the logger save_dir of every shipped config: replaced by --trainer.default_root_dir


def _keys(parser) -> list[str]:
    """Every option key a parser (and its subcommands) accepts, dotted."""
    keys = []
    for action in parser._actions:
        if action.dest not in ("help", "config", "print_config"):
            keys.append(action.dest)
        for sub in (getattr(action, "choices", None) or {}).values() if hasattr(action, "_name_parser_map") else []:
            keys += _keys(sub)
    return keys


class AgentArgumentParser(LightningArgumentParser):
    """A wrong option prints the error, the nearest known key (or allowed value), and where the
    manual is, instead of the full usage. Options are never abbreviated (``--trainer.max_epoch``
    is an error, not ``max_epochs``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or debug_mode_active():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        hints = _hints(message, _keys(parser))
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(
            f"error: {message}\n"
            + "".join(f"  {h}\n" for h in hints)
            + f"For the accepted options run: {prog} --help\n"
        )
        sys.exit(2)


def _hints(message: str, known: list[str]) -> list[str]:
    """ "did you mean" lines for a parser error: the closest real key for an unknown option
    (``--key`` or ``key "x"``), the closest allowed value for a value outside a ``Literal``."""
    hints = []
    keys = re.findall(r"--([A-Za-z_][\w.]*)", message) + re.findall(
        r"(?:[Kk]ey|option) \"?'?([A-Za-z_][\w.]*)", message
    )
    for key in dict.fromkeys(keys):
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if close:
                hints.append(f"did you mean '{close[0]}' for '{key}'?")
    literal = re.search(r"Literal\[(.*?)\]\. Got value: (\S+)", message)
    if literal:
        allowed, value = re.findall(r"'([^']*)'", literal.group(1)), literal.group(2).strip("'\"")
        close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.7)
        hints.append(f"did you mean '{close[0]}'?" if close else f"allowed: {', '.join(allowed)}")
    return hints


class AgentCLI(LightningCLI):
    """Checkpoints: an ``IterationCheckpoint`` (``--checkpoint.*``) writes ``last.ckpt`` every RL
    iteration to ``<save_dir>/<name>/checkpoints``, so ``--ckpt_path last`` resumes the previous
    run of the same config. ``--trainer.default_root_dir DIR`` moves logs and checkpoints to DIR
    (replacing the shipped configs' ``save_dir: runs``).

    Run folders: a fit logs to ``<save_dir>/<name>/version_N``; resumed, it logs on in the folder
    its checkpoint names. ``validate``/``test``/``predict`` of a run's checkpoint log to
    ``<run>/<subcommand>`` and predict writes ``<run>/predictions/``. Every checkpoint path is
    checked (``checkpointing.load_checkpoint_file``) before Lightning reads it, and its
    hyper-parameters set the model and env wherever the command line does not."""

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs) -> None:
        """Lightning's fit / validate / test / predict, and ``export`` listed beside them: ``main``
        hands ``rspo-lightning export ...`` to ``rspo_lightning.export`` (whose ``--help`` documents
        every flag) before this parser runs, so it is here for ``rspo-lightning --help``."""
        super()._add_subcommands(parser, **kwargs)
        summary = f"{export_summary} (rspo-lightning export --help)"
        parser._subcommands_action.add_subcommand("export", LightningArgumentParser(description=summary), help=summary)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(TranscriptLogger, "transcripts")
        parser.add_lightning_class_args(IterationCheckpoint, "checkpoint")
        if not (self.subclass_mode_model or self.subclass_mode_data):  # one source of the env: set data.env
            parser.link_arguments("data.env", "model.env")
        parser.set_defaults(
            {
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": DEFAULT_SAVE_DIR, "name": "rspo"},
                },
                "trainer.num_sanity_val_steps": -1,
                "trainer.log_every_n_steps": 1,
                # Lightning's summary table says the policy is in eval mode with 0 FLOPs (rollouts keep
                # it there; generate's FLOPs are not counted): the module prints one line instead
                "trainer.enable_model_summary": False,
            }
        )

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(str(self.subcommand), self.config)
        self._link_env_in_subclass_mode(cfg)
        self._seeds_from_seed_everything(cfg)
        trainer = cfg.get("trainer")
        root = trainer.get("default_root_dir") if trainer is not None else None
        logger = trainer.get("logger") if trainer is not None else None
        if logger not in (None, False, True):
            for one in logger if isinstance(logger, list) else [logger]:
                init = one.get("init_args") if hasattr(one, "get") else None
                if init is not None and root is not None and init.get("save_dir") == DEFAULT_SAVE_DIR:
                    init["save_dir"] = str(root)
                if (
                    init is not None
                    and str(one.get("class_path", "")).endswith("TensorBoardLogger")
                    and not _on_command_line(
                        "trainer.logger.init_args.default_hp_metric", getattr(self, "_cli_keys", [])
                    )
                ):
                    init["default_hp_metric"] = False  # Lightning's placeholder hp_metric = -1 measures nothing

    # -- checkpoints: checked before anything reads them; their own configuration ----------
    def parse_arguments(self, parser, args) -> None:
        self._cli_keys = _command_line_keys(sys.argv[1:] if args is None else args)
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """A checkpoint file given by path is checked by our loader (``CheckpointError``: the file,
        what is wrong, the other checkpoints of its folder) before Lightning or jsonargparse read
        it; ``last`` and ``hpc`` are resolved once the trainer knows its checkpoint folder
        (``_resolve_checkpoint``). For validate / test / predict the checkpoint's hyper-parameters
        then configure the model and its env wherever the command line sets nothing (the weights
        belong to the model that wrote them); a fit keeps the config files' values too. What they
        change is printed, one line per value."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if path and os.path.isdir(path) and not os.path.isfile(os.path.join(path, "meta.pt")):
            path = self.config[sub]["ckpt_path"] = _checkpoint_in_folder(path)  # a sharded folder stays itself
        if not path or path in SYMBOLIC_CKPT or not os.path.isfile(path):
            if path == "best":
                sys.exit(
                    "error: --ckpt_path best: IterationCheckpoint ranks no checkpoint by a metric; "
                    "pass a file, or last (the newest)"
                )
            if path and path not in SYMBOLIC_CKPT and not os.path.exists(path):
                _refuse(CheckpointError(f"checkpoint {path} does not exist; {other_checkpoints(path)}"))
            return
        self._checkpoint = _checked(path)
        hparams = dict(self._checkpoint.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams or "_class_path" in hparams or self.subclass_mode_model:
            return super()._parse_ckpt_path() if hparams else None
        user = self.config[sub].clone()
        try:
            self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write(
                f"error: the hyper-parameters of checkpoint {path} do not parse as this model's arguments\n"
            )
            raise
        cfg, changed = self.config[sub], []
        # a fit resumed from a file continues the run its config describes: there the config files'
        # values (those not left at their defaults) win too, as before; an evaluation measures the
        # checkpoint's own model
        defaults = self.parser._subcommands_action._name_parser_map[sub].get_defaults() if sub == "fit" else None
        for key, value in user.get("model").items(branches=False):
            given = defaults is not None and value != defaults.get(f"model.{key}")
            if given or _on_command_line(f"model.{key}", self._cli_keys):
                cfg[f"model.{key}"] = value
            elif cfg.get(f"model.{key}") != value:
                changed.append(f"model.{key}={cfg.get(f'model.{key}')!r} (config: {value!r})")
        env = hparams.get("env")  # the env it was trained on, for the data module too (the parse re-linked data.env)
        env = (
            env.as_dict()
            if hasattr(env, "as_dict")
            else dataclasses.asdict(env)
            if dataclasses.is_dataclass(env)
            else env
        )
        given = cfg.get("data.env")
        given = given.as_dict() if hasattr(given, "as_dict") else given
        if (
            isinstance(env, dict)
            and isinstance(given, dict)
            and env != given
            and not _on_command_line("data.env", self._cli_keys)
            and defaults is None
        ):
            changed.append(f"data.env={json.dumps(env, sort_keys=True)} (config: {json.dumps(given, sort_keys=True)})")
            cfg["data.env"] = Namespace(env_id=env["env_id"], kwargs=env.get("kwargs") or {})
            cfg["model.env"] = cfg["data.env"].clone()
        if changed:
            print(
                f"{sub}: the model and env of checkpoint {path}, where the command line sets nothing "
                f"({len(changed)} values differ from the config files):\n" + "\n".join(f"  {c}" for c in changed),
                flush=True,
            )

    def _resolve_checkpoint(self, subcommand: str) -> None:
        """``--ckpt_path last|hpc`` -> the file, checked like a path; ``last`` with nothing to
        resume: fit starts from the beginning saying so in one line, an evaluation stops. Then the
        run's folders: a resumed fit logs on in the log folder its checkpoint names (TensorBoard
        hides the points after the checkpoint that a killed run had written), an evaluation logs
        under ``<run>/<subcommand>``, and predictions go to ``<run>/predictions``."""
        kwargs = self.config_init[subcommand]
        path = kwargs.get("ckpt_path")
        ckpt_cb = next((c for c in self.trainer.callbacks if isinstance(c, IterationCheckpoint)), None)
        if ckpt_cb is not None:
            ckpt_cb._stable_dir(self.trainer)
        if path in ("last", "hpc"):
            found = _find_symbolic(path, ckpt_cb, self.trainer)
            if found is None:
                where = ckpt_cb.dirpath if path == "last" and ckpt_cb is not None else self.trainer.default_root_dir
                if subcommand == "fit":
                    print(
                        f"--ckpt_path {path}: no checkpoint to resume in {where}; starting from the beginning",
                        flush=True,
                    )
                    kwargs["ckpt_path"] = None
                    return self._set_run_folders(subcommand, None, None)
                sys.exit(f"error: --ckpt_path {path}: no checkpoint in {where} to {subcommand}; pass a checkpoint file")
            self._checkpoint, path = _checked(found), found
            kwargs["ckpt_path"] = found
        checkpoint = getattr(self, "_checkpoint", None) if path else None
        same_run = (
            ckpt_cb is not None
            and path is not None
            and os.path.isfile(path)
            and os.path.dirname(os.path.realpath(path)) == ckpt_cb.dirpath
        )
        version = checkpoint.get("rspo_log_version") if checkpoint is not None and same_run else None
        self._set_run_folders(
            subcommand, version, int(checkpoint.get("rspo_iteration", 0)) if checkpoint is not None else None
        )

    def _set_run_folders(self, subcommand: str, version: str | None, iteration: int | None) -> None:
        logger = self.trainer.logger
        if logger is None or not hasattr(logger, "_version"):
            return
        if subcommand == "fit":
            if version is not None:
                logger._version = version
                kwargs = getattr(logger, "_kwargs", None)  # TensorBoard's SummaryWriter arguments
                if isinstance(kwargs, dict) and kwargs.get("purge_step") is None and iteration is not None:
                    kwargs["purge_step"] = iteration + 1  # hides the points a killed run logged past its checkpoint
        else:
            logger._version = f"{version}/{subcommand}" if version else subcommand
        root = os.path.join(logger.save_dir, str(logger.name)) if getattr(logger, "save_dir", None) else None
        if root is not None:
            self.model.run_dir = os.path.join(root, version) if version else root

    def _run_subcommand(self, subcommand: str) -> None:
        """The subcommand, its checkpoint resolved first; a run that fails before it completed an
        iteration (fit) or anything (validate, test, predict) removes the log folder it created."""
        self._resolve_checkpoint(subcommand)
        if subcommand == "fit":
            self._lock_run()
        folder = getattr(self.trainer.logger, "log_dir", None) if self.trainer.logger is not None else None
        existed = folder is None or os.path.exists(folder)
        start = getattr(self.model, "iteration", 0)
        try:
            super()._run_subcommand(subcommand)
        except BaseException as exc:
            if not existed and (subcommand != "fit" or getattr(self.model, "iteration", 0) == start):
                if getattr(self, "_run_lock", None) is not None:
                    self._run_lock.release(discard=True)
                _remove_new_folder(folder, getattr(self.trainer.logger, "save_dir", None))
            if getattr(self.model, "iteration", 0) != start:
                exc.rspo_after_first_iteration = True  # main() shows its traceback: not a startup error
            raise
        finally:
            if getattr(self, "_run_lock", None) is not None:
                self._run_lock.release()

    def _lock_run(self) -> None:
        """One writer per run: global rank 0 of a fit holds ``RunLock`` on its checkpoint folder
        until the fit (or its process) ends (evaluations read without it); a second fit of the same run stops
        here, naming the holder's pid and the ways out."""
        callbacks = [c for c in self.trainer.checkpoint_callbacks if isinstance(c, IterationCheckpoint)]
        if not callbacks or not self.trainer.is_global_zero:
            return
        callbacks[0]._stable_dir(self.trainer)
        self._run_lock = RunLock(callbacks[0].dirpath)
        try:
            self._run_lock.acquire()
        except RunLockedError as exc:
            _refuse(exc)

    @staticmethod
    def _seeds_from_seed_everything(cfg) -> None:
        """An unset ``model.seed`` / ``data.seed`` takes the run's ``seed_everything``: the rollouts
        and the task draws are seeded by them, not by torch's global RNG, so without this
        ``--seed_everything N`` alone would replay the same run."""
        seed = cfg.get("seed_everything")
        if seed is None or isinstance(seed, bool):
            return
        for key in ("model", "data"):
            group = cfg.get(key)  # the class's arguments, under init_args when the class is named
            args = group.get("init_args", group) if group is not None else None
            if args is not None and "seed" in args and args["seed"] is None:
                args["seed"] = int(seed)

    def _link_env_in_subclass_mode(self, cfg) -> None:
        """``data.env`` -> ``model.env`` when the classes are named (``--model CLASS``), where a
        parser link cannot be declared (the model may take no env): a model taking ``env`` that
        is left unset gets the datamodule's."""
        model, data = cfg.get("model"), cfg.get("data")
        m_init = model.get("init_args") if hasattr(model, "get") else None
        d_init = data.get("init_args") if hasattr(data, "get") else None
        if (
            m_init is not None
            and d_init is not None
            and "env" in m_init
            and m_init.get("env") is None
            and d_init.get("env") is not None
        ):
            m_init["env"] = d_init["env"]

    def _instantiate_trainer(self, config: dict, callbacks: list) -> Trainer:
        if config.get("enable_checkpointing") is False:  # Lightning refuses a checkpoint callback then
            callbacks = [c for c in callbacks if not isinstance(c, IterationCheckpoint)]
        given = [*callbacks, *(config.get("callbacks") or [])]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks = [*callbacks, IterationProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if "verbose" in self._subcommand_method_arguments.get(subcommand, ()) and not self.subclass_mode_model:
            parser.set_defaults(verbose=False)  # AgentRLModule prints one table (metrics.results_table)
        return parser


SYMBOLIC_CKPT = ("last", "best", "hpc", "registry")


def _command_line_keys(args) -> list[str]:
    """The dotted keys an argument list sets (``--model.policy.source x`` -> ``model.policy.source``)."""
    if isinstance(args, dict):
        return [k for k in args]
    return [a[2:].split("=", 1)[0] for a in (args or []) if isinstance(a, str) and a.startswith("--") and len(a) > 2]


def _on_command_line(key: str, cli_keys: list[str]) -> bool:
    return any(key == c or key.startswith(c + ".") or c.startswith(key + ".") for c in cli_keys)


def _checkpoint_in_folder(folder: str) -> str:
    """``--ckpt_path FOLDER``: the ``last.ckpt`` it holds (a run's ``checkpoints/`` folder), else
    exit naming the checkpoints it does hold."""
    last = os.path.join(folder, "last.ckpt")
    if os.path.isfile(last):
        return last
    _refuse(CheckpointError(f"--ckpt_path {folder} is a folder without last.ckpt; {other_checkpoints(last)}"))


def _refuse(exc: Exception) -> None:
    sys.stderr.write(f"error: {exc}\n")
    sys.exit(1)


def _checked(path: str) -> dict:
    """The checkpoint at ``path`` through ``load_checkpoint_file`` (memory-mapped: the tensors stay
    on disk), or exit naming the file, what is wrong and the other checkpoints of its folder."""
    try:
        return load_checkpoint_file(path, map_location="cpu", weights_only=True, mmap=True)
    except CheckpointError as exc:
        _refuse(exc)


def _find_symbolic(path: str, ckpt_cb, trainer) -> str | None:
    """The newest ``last*.ckpt`` of the checkpoint folder (``last``) or ``hpc_ckpt_<n>.ckpt`` of
    ``default_root_dir`` (``hpc``, as Lightning numbers them), or None."""
    if path == "last":
        found = (
            [p for p in glob.glob(os.path.join(glob.escape(ckpt_cb.dirpath), "last*.ckpt"))]
            if ckpt_cb is not None
            else []
        )
        return max(found, key=os.path.getmtime) if found else None
    found = glob.glob(os.path.join(glob.escape(trainer.default_root_dir), "hpc_ckpt_*.ckpt"))
    return max(found, key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0)) if found else None


def _remove_new_folder(folder: str, save_dir: str | None) -> None:
    """``folder`` and the parents it emptied, up to ``save_dir``."""
    shutil.rmtree(folder, ignore_errors=True)
    stop = os.path.realpath(save_dir) if save_dir else None
    parent = os.path.dirname(os.path.realpath(folder))
    while stop is not None and parent.startswith(stop + os.sep) and os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)
        parent = os.path.dirname(parent)


def _names_a_class(argv: list[str]) -> bool:
    """True when the command line or a config file picks the model/data class explicitly."""
    for i, arg in enumerate(argv):
        if arg in ("--model", "--data") or arg.startswith(("--model=", "--data=", "--model.help", "--data.help")):
            return True
        if arg in ("--config", "-c") and i + 1 < len(argv):
            try:
                with open(argv[i + 1]) as f:
                    cfg = yaml.safe_load(f) or {}
            except OSError:
                continue  # the CLI itself reports the missing file
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
                raise ValueError(f"--config {argv[i + 1]} is not valid YAML ({problem}{where}); fix the file") from None
            if not isinstance(cfg, dict):
                raise ValueError(
                    f"--config {argv[i + 1]} must hold a mapping of sections (trainer:, model:, data:, ...), "
                    f"got a YAML {type(cfg).__name__}; see configs/quickstart.yaml"
                )
            if any(isinstance(cfg.get(k), dict) and "class_path" in cfg[k] for k in ("model", "data")):
                return True
    return False


class _NoTips(logging.Filter):
    """Drops Lightning's advertising lines ("Tip: ... litlogger / litmodels"): nothing a user of
    this package can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip: For seamless cloud" not in record.getMessage()


DEBUG_ENV = "RSPO_DEBUG"
#: What a user's input can raise before the first iteration (a value, a path, an env, a package):
#: one ``error:`` line and exit 2 (``--debug`` or RSPO_DEBUG=1: the traceback).
USER_ERRORS = (
    ValueError,
    TypeError,
    LookupError,
    OSError,
    ImportError,
    CheckpointError,
    RunLockedError,
    yaml.YAMLError,
)


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message of a user's error, or None when ``exc`` is not one (a bug, or an
    error after training started): the message of the first exception of its chain whose type
    is a user error."""
    if getattr(exc, "rspo_after_first_iteration", False) and not isinstance(exc, (CheckpointError, RunLockedError)):
        return None  # a checkpoint that cannot be written (full disk, read-only folder) is named at any time
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for err in chain:
        if isinstance(err, USER_ERRORS):
            text = " ".join(str(err).split()) or type(err).__name__
            if isinstance(err, OSError) and getattr(err, "filename", None) and str(err.filename) not in text:
                text += f": {err.filename}"
            gym = type(err).__module__.startswith("gymnasium")
            return f"{'environment: ' if gym else ''}{text}"
    return None


def main(args: list[str] | None = None) -> None:
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NoTips())
    argv = list(sys.argv[1:] if args is None else args)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        if args is None:
            sys.argv[1:] = argv
        else:
            args = argv
    try:
        _main(argv, args)
    except Exception as exc:
        message = None if debug else user_error_message(exc)
        if message is None:
            raise
        sys.stderr.write(f"error: {message}\n(the traceback: add --debug or set {DEBUG_ENV}=1)\n")
        sys.exit(2)


def _main(argv: list[str], args: list[str] | None) -> None:
    if argv[:1] == ["export"]:  # agent A of a checkpoint as a Hugging Face directory (rspo_lightning/export.py)
        from rspo_lightning.export import main as export_main

        sys.exit(export_main(argv[1:]))
    # from the console script LightningCLI reads sys.argv itself (passing both makes it warn)
    kwargs = dict(
        args=args,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        parser_class=AgentArgumentParser,
    )
    if _names_a_class(argv):
        AgentCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True, **kwargs)
    else:
        from rspo_lightning.datamodules import AgentDataModule
        from rspo_lightning.module import AgentRLModule

        AgentCLI(AgentRLModule, AgentDataModule, **kwargs)


if __name__ == "__main__":
    main()
