"""Rollout exactness: stored ids are the generated ids; stored log-probs are reproducible."""

import torch
from conftest import EASY_ENV
from rollout_helpers import forward_logprobs

from rspo_lightning.batching import flatten, left_pad, make_train_batch
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.trie import ActionTrie, TrieConstraint
from rspo_lightning.types import TaskSpec


def _play(tiny_policy, constrained, temperature=1.0, n_tasks=4, group=3):
    model, tok = tiny_policy
    torch.manual_seed(0)
    cfg = RolloutConfig(constrained_decoding=constrained, max_new_tokens=10, temperature=temperature)
    engine = RolloutEngine(model, tok, cfg, EASY_ENV)
    tasks = [TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(n_tasks)]
    return engine, engine.collect(tasks, group)


def _check_exact(tiny_policy, constrained, temperature):
    model, tok = tiny_policy
    engine, trajs = _play(tiny_policy, constrained, temperature)
    assert len(trajs) == 12 and all(t.turns for t in trajs)
    flat = flatten(trajs)
    batch = make_train_batch(flat, engine.pad_id, torch.zeros(len(flat.turns)))
    lp = forward_logprobs(model, batch, temperature)
    mask = batch.response_mask
    # Every stored response sits exactly at the end of its row: the tokens trained on are the
    # generated tokens, with no decode/re-encode round trip.
    for i, turn in enumerate(flat.turns):
        r = len(turn.response_ids)
        assert torch.equal(batch.input_ids[i, -r:], turn.response_ids)
        assert int(mask[i].sum()) == r
    diff = (lp - batch.behaviour_logprobs).abs()[mask]
    assert diff.max().item() < 1e-4, diff.max().item()


def test_free_generation_logprobs_match_training_forward(tiny_policy):
    _check_exact(tiny_policy, constrained=False, temperature=1.0)


def test_free_generation_logprobs_match_at_other_temperature(tiny_policy):
    _check_exact(tiny_policy, constrained=False, temperature=0.7)


def test_constrained_logprobs_match_renormalised_training_forward(tiny_policy):
    _check_exact(tiny_policy, constrained=True, temperature=1.0)


def test_constrained_responses_are_admissible_actions(tiny_policy):
    _, trajs = _play(tiny_policy, constrained=True)
    for t in trajs:
        for turn in t.turns:
            assert turn.valid, turn.action
    # the stored allowed sets contain the generated token at every position
    for t in trajs:
        for turn in t.turns:
            for j, tokid in enumerate(turn.response_ids.tolist()):
                assert tokid in turn.allowed_ids[j].tolist()


def test_free_generation_stops_after_action_close(tiny_policy):
    model, tok = tiny_policy
    _, trajs = _play(tiny_policy, constrained=False)
    close = tok.convert_tokens_to_ids("</action>")
    for t in trajs:
        for turn in t.turns:
            ids = turn.response_ids.tolist()
            assert 1 <= len(ids) <= 10
            # a response ends at its first stop token or at max_new_tokens, never after a stop
            stops = [j for j, x in enumerate(ids) if x in (close, tok.eos_token_id)]
            if stops:
                assert stops[0] == len(ids) - 1


def test_trie_lists_allowed_continuations():
    trie = ActionTrie([[1, 2, 3], [1, 2, 4], [5]])
    assert sorted(trie.root) == [1, 5]
    assert sorted(trie.root[1][2]) == [3, 4]
    assert trie.root[5] == {}
    # breadth-first tensor form: 0 -> {1: node 1, 5: node 2}, 1 -> {2: node 3}, 3 -> {3: 4, 4: 5}
    assert trie.children.tolist() == [[1, 5], [2, -1], [-1, -1], [3, 4], [-1, -1], [-1, -1]]
    assert trie.child_nodes.tolist() == [[1, 2], [3, -1], [-1, -1], [4, 5], [-1, -1], [-1, -1]]


def test_trie_constraint_masks_follows_samples_and_records_allowed_ids_by_hand():
    pad, vocab, prompt_len = 0, 8, 2
    first, second = ActionTrie([[1, 2, 3], [1, 2, 4], [5]]), ActionTrie([[6, 7]])
    constraint = TrieConstraint([first, first, second], prompt_len, pad)
    sampled = [[1, 2, 3, pad], [5, pad, pad, pad], [6, 7, pad, pad]]  # rows end after 3, 1 and 2 tokens
    expected = [  # allowed ids of rows 0, 1, 2 at each step, worked out from the tries
        [{1, 5}, {1, 5}, {6}],
        [{2}, {pad}, {7}],
        [{3, 4}, {pad}, {pad}],
        [{pad}, {pad}, {pad}],
    ]
    ids = torch.full((3, prompt_len), 9)
    for step in range(4):
        out = constraint(ids, torch.zeros(3, vocab))
        for row in range(3):
            assert {j for j in range(vocab) if out[row, j] == 0} == expected[step][row]
            assert torch.isinf(out[row]).sum() == vocab - len(expected[step][row])
        ids = torch.cat([ids, torch.tensor([[r[step]] for r in sampled])], dim=1)
    got = constraint.allowed_ids(torch.tensor([3, 1, 2]))
    assert [g.tolist() for g in got] == [[[1, 5], [2, -1], [3, 4]], [[1, 5]], [[6], [7]]]


def test_select_trims_shared_padding_without_moving_responses(tiny_policy):
    engine, trajs = _play(tiny_policy, constrained=True)
    flat = flatten(trajs)
    batch = make_train_batch(flat, engine.pad_id, torch.arange(len(flat.turns), dtype=torch.float32))
    rows = torch.tensor([0, len(flat.turns) - 1])
    sub = batch.select(rows)
    assert sub.input_ids.shape[1] <= batch.input_ids.shape[1]
    assert bool(sub.attention_mask[:, 0].any())  # no all-padding leading column left
    for j, i in enumerate(rows.tolist()):
        turn = flat.turns[i]
        r = len(turn.response_ids)
        assert torch.equal(sub.input_ids[j, -r:], turn.response_ids)
        assert int(sub.response_mask[j].sum()) == r
        assert torch.equal(sub.behaviour_logprobs[j][sub.response_mask[j]], turn.behaviour_logprobs)
        assert sub.input_ids[j, sub.value_positions[j]] == turn.prompt_ids[-1]
        assert sub.advantages[j] == i


def test_prompt_over_the_context_drops_history_then_cuts_the_observation(tiny_policy):
    import warnings

    import rspo_lightning.prompts as prompts
    from rspo_lightning.prompts import HistoryEntry, build_turn_prompt

    _, tok = tiny_policy
    cfg = RolloutConfig(template="compact", history_window=2, system_prompt="")
    info = {"task": "put a apple in fridge.", "admissible_actions": ["go to fridge 1", "go to shelf 1"]}
    history = [HistoryEntry("You arrive at shelf 1.", "go to shelf 1")] * 3
    obs = "You arrive at fridge 1. " * 10
    full = build_turn_prompt(tok, cfg, info, obs, history, 3)
    no_history = build_turn_prompt(
        tok, RolloutConfig(template="compact", history_window=0, system_prompt=""), info, obs, history, 3
    )
    assert len(no_history) < len(full)
    # a budget that fits without history: the history goes, the observation stays whole
    assert build_turn_prompt(tok, cfg, info, obs, history, 3, max_tokens=len(no_history)) == no_history
    # a smaller budget: the observation is cut in the middle, once-only warning, never over budget
    prompts._TRUNCATION_WARNED = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cut = build_turn_prompt(tok, cfg, info, obs, history, 3, max_tokens=len(no_history) - 20)
        build_turn_prompt(tok, cfg, info, obs * 50, history, 3, max_tokens=len(no_history) - 20)
    assert len(cut) <= len(no_history) - 20
    assert tok.decode(cut).count("arrive") < tok.decode(no_history).count("arrive")  # observation cut
    assert tok.decode(cut).count("Task") == 1 and "Admissible" in tok.decode(cut)  # the rest kept
    assert tok.convert_ids_to_tokens(cut[-1]) == "<|assistant|>"  # the generation prompt survives
    assert sum("exceeds the model's context" in str(w.message) for w in caught) == 1
    # an absurd budget still returns a list that fits, never an index error
    assert len(build_turn_prompt(tok, cfg, info, obs, history, 3, max_tokens=3)) <= 3


def test_batched_prompt_building_gives_the_ids_of_one_by_one(tiny_policy):
    from rspo_lightning.prompts import HistoryEntry, build_turn_prompt, build_turn_prompts

    _, tok = tiny_policy
    cfg = RolloutConfig(template="compact", history_window=2, system_prompt="")
    info = {"task": "put a apple in fridge.", "admissible_actions": ["go to fridge 1", "go to shelf 1"]}
    turns = [
        (info, "You arrive at fridge 1. " * k, [HistoryEntry("You arrive at shelf 1.", "go to shelf 1")] * k, k)
        for k in range(5)
    ]
    one_by_one = [build_turn_prompt(tok, cfg, *t) for t in turns]
    assert build_turn_prompts(tok, cfg, turns) == one_by_one and len(set(map(len, one_by_one))) == 5
    # with a budget the long ones are shrunk exactly as alone
    budget = len(one_by_one[2])
    assert build_turn_prompts(tok, cfg, turns, budget) == [build_turn_prompt(tok, cfg, *t, budget) for t in turns]
    assert build_turn_prompts(tok, cfg, []) == []


def _byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|end|>", "<action>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["go to the fridge 1\n\nYou arrive at shelf 2.  Then  look."] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>")


def test_encode_texts_equals_the_tokenizer_call_on_both_paths(tiny_policy):
    from rspo_lightning.prompts import encode_texts

    _, tiny = tiny_policy
    texts = [
        "go to fridge 1",
        "You arrive at shelf 1 .",
        "go to fridge 1",
        "",
        "<action> go to fridge 1 </action>",
        "two\n\nlines  with   spaces",
        "You arrive at shelf 1 .",
    ]
    for tok in (tiny, _byte_level_bpe()):
        expected = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        assert encode_texts(tok, texts) == expected  # the direct Rust path
        tok._tokenizer.enable_padding(pad_id=0, pad_token="<|end|>")  # a backend not set as HF sets it
        assert encode_texts(tok, texts) == expected  # goes through __call__ (which turns padding off)
        assert tok._tokenizer.padding is None
    assert encode_texts(tiny, []) == []


def test_chat_template_reuse_is_exact_and_falls_back_for_templates_that_change_the_message(tiny_policy):
    import copy

    from rspo_lightning.prompts import _apply_chat_template, chat_prompt_text

    _, tok = tiny_policy
    trimming = copy.deepcopy(tok)
    trimming.chat_template = tok.chat_template.replace("message['content']", "(message['content'] | trim)")
    for t in (tok, trimming):
        for msg in ("go to fridge 1", "  padded  ", "two\nlines", ""):
            for system in (None, "be brief"):
                assert chat_prompt_text(t, msg, system) == _apply_chat_template(t, msg, system)
    assert set(tok._rspo_chat_parts.values()) != {None}  # reused where it is exact
    mine = {v for (template, _), v in trimming._rspo_chat_parts.items() if template == trimming.chat_template}
    assert mine == {None}  # rendered every time where the template trims
    assert "  padded  " not in chat_prompt_text(trimming, "  padded  ", None)  # trimmed, as the template says


def test_action_ids_in_one_call_equal_one_by_one(tiny_policy):
    from rspo_lightning.prompts import action_response_ids

    _, tok = tiny_policy
    actions = ["go to fridge 1", "take apple 1 from countertop 1", "look"]
    assert action_response_ids(tok, actions) == [action_response_ids(tok, a) for a in actions]
    assert action_response_ids(tok, []) == []


def test_left_pad_lists_and_tensors_by_hand():
    expected_ids = [[0, 0, 5], [7, 8, 9], [0, 4, 3]]
    expected_mask = [[0, 0, 1], [1, 1, 1], [0, 1, 1]]
    for rows in ([[5], [7, 8, 9], [4, 3]], [torch.tensor([5]), torch.tensor([7, 8, 9]), torch.tensor([4, 3])]):
        ids, mask = left_pad(rows, pad_id=0)
        assert ids.dtype == mask.dtype == torch.long
        assert ids.tolist() == expected_ids and mask.tolist() == expected_mask
