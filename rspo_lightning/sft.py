"""SFTModule: supervised fine-tuning (behaviour cloning) of the policy on recorded turns.

The warm start before RL: train the policy with next-token cross-entropy on the response
tokens of expert demonstrations (``python -m rspo_lightning.demos expert``), batched by
``TrajectoryDataModule``. At the end of training the model and tokenizer are saved as a
Hugging Face directory ``{trainer.log_dir}/hf``; point an RL config's ``model.policy.source``
at it.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from rspo_lightning.config import OptimConfig, PolicyConfig
from rspo_lightning.datamodules.trajectory import IGNORE_INDEX
from rspo_lightning.language_model import load_policy


class SFTModule(pl.LightningModule):
    """Masked next-token cross-entropy on response tokens (prompt and padding carry no loss).

    Args:
        policy: the model to fine-tune. ``source`` must be something loadable without a corpus
            (a Hugging Face directory, e.g. the one ``trajectory_io expert --save-policy DIR``
            writes, a ``.gguf`` path or ``smollm2``): the demos' token ids only mean something
            under the tokenizer that wrote them, so ``tiny`` is refused.
        optim: AdamW settings; the schedule's ``warmup_iterations`` / ``decay_iterations`` count
            optimizer steps here.
        tokenizer_dir: directory whose tokenizer is used instead of the source's own (it must
            be the one the demos were tokenised with); None = the source's tokenizer.
    """

    def __init__(
        self,
        policy: PolicyConfig = PolicyConfig(),
        optim: OptimConfig = OptimConfig(lr=1e-4),
        tokenizer_dir: str | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.policy_cfg = policy
        self.optim_cfg = optim
        self.tokenizer_dir = tokenizer_dir
        self.policy = None
        self.tokenizer = None
        # token-level held-out means over every rank's tokens (torchmetrics sync them in compute)
        self.val_loss, self.val_accuracy = MeanMetric(), MeanMetric()

    # -- building ------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        if self.policy_cfg.source == "tiny":
            raise ValueError(
                "SFTModule cannot build model.policy.source: tiny: the tiny word-level tokenizer is trained on a corpus, "
                "and the demos' token ids only mean something under the tokenizer that wrote them. Write the demos and "
                "the tiny policy together with `python -m rspo_lightning.demos expert --policy-source tiny "
                "--save-policy DIR --out demos.jsonl ...` and set model.policy.source: DIR"
            )
        self.policy, tokenizer = load_policy(
            self.policy_cfg.source,
            gguf_file=self.policy_cfg.gguf_file,
            trust_remote_code=self.policy_cfg.trust_remote_code,
        )
        if self.tokenizer_dir is not None:
            tokenizer = self._load_tokenizer(self.tokenizer_dir)
        self.tokenizer = tokenizer
        if self.policy_cfg.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.policy.train()

    def _load_tokenizer(self, directory: str):
        from transformers import AutoTokenizer

        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"model.tokenizer_dir: {directory!r} is not a directory; pass the directory the demos' tokenizer was saved in"
            )
        tokenizer = AutoTokenizer.from_pretrained(
            directory, local_files_only=True, trust_remote_code=self.policy_cfg.trust_remote_code
        )
        vocab = self.policy.get_input_embeddings().num_embeddings
        if len(tokenizer) > vocab:
            raise ValueError(
                f"model.tokenizer_dir: the tokenizer in {directory!r} has {len(tokenizer)} tokens but the model's "
                f"embedding has {vocab} rows; use the tokenizer saved with this model"
            )
        return tokenizer

    def setup(self, stage: str) -> None:
        self.configure_model()

    def configure_optimizers(self):
        params = [p for p in self.policy.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            params, lr=self.optim_cfg.lr, betas=self.optim_cfg.betas, weight_decay=self.optim_cfg.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.optim_cfg.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- loss ----------------------------------------------------------------------------
    def sft_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(mean cross-entropy over response tokens, token accuracy, number of response tokens)``."""
        out = self.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        # Column t predicts token t + 1.
        targets = batch["labels"][:, 1:]
        mask = targets != IGNORE_INDEX
        count = int(mask.sum())
        if count == 0:
            raise ValueError(
                "SFT batch has no response tokens (every label is -100); check the trajectories' response_ids"
            )
        picked = out.logits[:, :-1][mask].float()  # [M, V]: response positions only, upcast after the gather
        gold = targets[mask]
        loss = F.cross_entropy(picked, gold)
        accuracy = (picked.argmax(-1) == gold).float().mean()
        return loss, accuracy.detach(), count

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, accuracy, count = self.sft_loss(batch)
        n = batch["input_ids"].shape[0]
        self.log("train/sft_loss", loss.detach(), on_step=True, prog_bar=True, batch_size=n)
        self.log("train/token_accuracy", accuracy, on_step=True, prog_bar=True, batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, batch_size=n)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, accuracy, count = self.sft_loss(batch)
        # weighted by response tokens so the epoch value is the token-level mean over all ranks
        self.val_loss.update(loss.detach(), weight=count)
        self.val_accuracy.update(accuracy, weight=count)
        self.log("val/sft_loss", self.val_loss, on_epoch=True, prog_bar=True, batch_size=count)
        self.log("val/token_accuracy", self.val_accuracy, on_epoch=True, batch_size=count)

    # -- export --------------------------------------------------------------------------
    def save_pretrained(self, directory: str) -> str:
        """Save model + tokenizer as a Hugging Face directory (``model.policy.source`` of an RL run)."""
        os.makedirs(directory, exist_ok=True)
        self.policy.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def on_train_end(self) -> None:
        # Sharded strategies would need a full-state gather first; SFT here runs unsharded.
        if self.trainer.is_global_zero:
            directory = os.path.join(self.trainer.log_dir or self.trainer.default_root_dir, "hf")
            self.save_pretrained(directory)
            self.export_dir = directory
