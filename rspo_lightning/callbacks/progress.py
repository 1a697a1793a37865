"""IterationProgressBar: Lightning's TQDM bar showing what an RL run is at (the CLI's default)."""

from __future__ import annotations

from lightning.pytorch.callbacks import TQDMProgressBar

INTEGER_ITEMS = ("it", "phase")  # the RL iteration; RSPOLoop's phase (0 explore, 1 collect, 2 exploit)


class IterationProgressBar(TQDMProgressBar):
    """The RL iteration as an integer (``it``) and agent A's training success (``success_A``)
    beside the losses; no ``v_num`` (the log folder's version says nothing about progress)."""

    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        for key in INTEGER_ITEMS:
            if key in items:
                items[key] = int(items[key])
        return items
