"""``choices``: each config choice is one Literal, the source of --help's choices, the parse
error, and the message of a Python caller's ValueError."""

import os

import pytest

from rspo_lightning import choices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_bad_choice_fails_the_parse_listing_the_choices(capsys):
    from rspo_lightning.cli import main

    for key, bad, shown in [
        ("--model.algorithm.loss_agg", "token_mean", "'seq-mean-token-sum'"),
        ("--trainer.callbacks.replay_unit", "turn", "'trajectory'"),
        ("--data.reward_mode", "shaped", "'outcome+dense'"),
    ]:
        config = "compare/grpo_rspo.yaml" if "callbacks" in key else "quickstart.yaml"
        with pytest.raises(SystemExit) as info:
            main(["fit", "--config", os.path.join(ROOT, "configs", config), key, bad, "--print_config"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and key.rsplit(".", 1)[1] in err and bad in err and shown in err, err


def test_python_callers_get_the_same_choices():
    from rspo_lightning.callbacks import RSPOLoop
    from rspo_lightning.config import AlgorithmConfig
    from rspo_lightning.rspo.buffer import ReplayBuffer

    with pytest.raises(ValueError, match=r"algorithm.loss_agg must be one of \['token-mean', .*\], got 'token_mean'"):
        AlgorithmConfig(loss_agg="token_mean")
    with pytest.raises(ValueError, match=r"RSPOLoop replay_from must be one of \['explorer', 'history', 'both'\]"):
        RSPOLoop(replay_from="all")
    with pytest.raises(ValueError, match=r"replay slots must be one of \['signal', 'positive', 'positive_repeat'\]"):
        ReplayBuffer(slots="wins")
    assert choices.values(choices.ClipMode) == ("additive", "multiplicative")
    assert choices.values(choices.AdaptiveClip) == ("signal", "inverse_advantage")  # A²TGPO's, a different set
