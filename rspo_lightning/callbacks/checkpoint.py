"""``IterationCheckpoint``: Lightning's ModelCheckpoint counting RL iterations, with agent A written as a
Hugging Face directory at the end of fit (``export_hf``). A callback beside the others, above
``checkpointing`` (the checkpoint files) and ``export`` in the import graph (docs/design.md §2)."""

from __future__ import annotations

import os

from lightning.pytorch.callbacks import ModelCheckpoint

from rspo_lightning.export import export


class IterationCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every_n_iterations`` RL iterations, ``iteration=<n>.ckpt`` at epoch ends.

    Args:
        dirpath: where checkpoints go; None = ``<logger save_dir>/<logger name>/checkpoints``
            (``<default_root_dir>/checkpoints`` without a logger): the same for every run of a
            config, so ``--ckpt_path last`` finds the previous run's.
        every_n_iterations: iterations between two saves of ``last.ckpt`` (0 = only at epoch ends).
        save_top_k: epoch-end checkpoints kept (-1 = all; they carry the iteration in their name).
        export_hf: at the end of fit, write agent A of the last checkpoint as a Hugging Face
            directory ``<dirpath>/../hf`` (``rspo_lightning.export``; written next to it and renamed).
        export_hf_every_epoch: also at every epoch end (the same directory, replaced whole).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_iterations: int = 1,
        save_top_k: int = 1,
        export_hf: bool = False,
        export_hf_every_epoch: bool = False,
    ):
        if every_n_iterations < 0:
            raise ValueError(
                f"IterationCheckpoint.every_n_iterations must be >= 0 (0 = epoch ends only), got {every_n_iterations}"
            )
        super().__init__(
            dirpath=dirpath,
            filename="iteration={iteration}",
            save_last=True,
            save_top_k=save_top_k,
            every_n_epochs=1,
            save_on_train_epoch_end=True,
            auto_insert_metric_name=False,
        )
        self.every_n_iterations = every_n_iterations
        self.export_hf, self.export_hf_every_epoch = export_hf, export_hf_every_epoch

    def _export_hf(self, trainer) -> None:
        trainer.strategy.barrier("export_hf")  # every rank's shard of the last checkpoint is written
        if trainer.is_global_zero and self.last_model_path:
            out = os.path.join(os.path.dirname(self.dirpath), "hf")
            export(self.last_model_path, out, overwrite=True)
            print(f"export_hf: agent A of {self.last_model_path} written to {out}")

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.export_hf or self.export_hf_every_epoch:
            self._export_hf(trainer)

    def _stable_dir(self, trainer) -> None:
        if self.dirpath is None:
            if trainer.loggers:
                logger = trainer.loggers[0]
                root = os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name))
            else:
                root = trainer.default_root_dir
            self.dirpath = os.path.realpath(os.path.join(root, "checkpoints"))

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("dirpath") not in (None, self.dirpath):
            return  # another folder's checkpoint (an evaluation, a moved run): none of its bookkeeping applies here
        super().load_state_dict(state_dict)

    def _find_last_checkpoints(self, trainer) -> set[str]:
        self._stable_dir(trainer)
        return super()._find_last_checkpoints(trainer)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._stable_dir(trainer)
        super().setup(trainer, pl_module, stage)

    def format_checkpoint_name(
        self, metrics: dict, filename: str | None = None, ver: int | None = None, prefix: str | None = None
    ) -> str:
        module = getattr(self, "_module", None)
        metrics = {**metrics, "iteration": int(getattr(module, "iteration", 0))}
        return super().format_checkpoint_name(metrics, filename, ver, prefix)

    def on_train_start(self, trainer, pl_module) -> None:
        self._module = pl_module
        super().on_train_start(trainer, pl_module)

    def _should_skip_saving_checkpoint(self, trainer) -> bool:
        # ModelCheckpoint skips a save when no optimizer step happened since the last one; an RL
        # iteration without one (RSPO's collect, all-zero advantages) still changes the run's state.
        from lightning.pytorch.trainer.states import TrainerFn

        return bool(trainer.fast_dev_run) or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._module = pl_module
        n = int(getattr(pl_module, "iteration", 0))
        epoch_end = batch_idx + 1 >= trainer.num_training_batches  # saved by on_train_epoch_end, after validation
        if (
            self.every_n_iterations
            and n % self.every_n_iterations == 0
            and not epoch_end
            and not self._should_skip_saving_checkpoint(trainer)
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._module = pl_module
        if self._should_skip_saving_checkpoint(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        if self.save_top_k != 0:
            self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)
        if self.export_hf_every_epoch:
            self._export_hf(trainer)
