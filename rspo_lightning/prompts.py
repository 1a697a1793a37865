"""Prompt templates (verl-agent style) and the per-turn prompt builder.

Each turn's prompt is rebuilt from scratch: task, step count, the last ``history_window``
(observation, action) pairs, the current observation and the admissible actions. The context
therefore stays flat however long the episode runs (docs/design.md §3).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

HOUSEHOLD_TEMPLATE = (
    "You are an expert agent operating in a household environment. Your task is to: {task}\n"
    "Prior to this step, you have already taken {step} step(s). Below are the most recent "
    "{history_len} observations and the corresponding actions you took: {history}\n"
    "You are now at step {current_step} and your current observation is: {observation}\n"
    "Your admissible actions of the current situation are:{admissible}\n"
    "Now it's your turn to take an action. You should first reason step-by-step about the "
    "current situation. This reasoning process MUST be enclosed within <think> </think> tags. "
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)

HOUSEHOLD_TEMPLATE_NO_HISTORY = (
    "You are an expert agent operating in a household environment. Your task is to: {task}\n"
    "Your current observation is: {observation}\n"
    "Your admissible actions of the current situation are:{admissible}\n"
    "Now it's your turn to take an action. You should first reason step-by-step about the "
    "current situation. This reasoning process MUST be enclosed within <think> </think> tags. "
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)

# Compact variant for tiny CPU models: the same information with ~80 fewer words of boilerplate.
COMPACT_TEMPLATE = (
    "Task: {task}\nStep {current_step}. Recent history:{history}\nObservation: {observation}\n"
    "Admissible actions:{admissible}\nAnswer with <action> </action>."
)
COMPACT_TEMPLATE_NO_HISTORY = (
    "Task: {task}\nObservation: {observation}\nAdmissible actions:{admissible}\nAnswer with <action> </action>."
)

# compact with the task moved next to the admissible actions: the words the chosen action must copy
# (object, goal receptacle) sit a few tokens before the answer instead of behind the history.
COMPACT_NEAR_TEMPLATE = (
    "Step {current_step}. Recent history:{history}\nObservation: {observation}\nTask: {task}\n"
    "Admissible actions:{admissible}\nAnswer with <action> </action>."
)
COMPACT_NEAR_TEMPLATE_NO_HISTORY = (
    "Observation: {observation}\nTask: {task}\nAdmissible actions:{admissible}\nAnswer with <action> </action>."
)

# the task last, right before the answer: the word the action copies then sits a fixed number of
# tokens before the position that writes it, however many actions are listed.
COMPACT_LAST_TEMPLATE = (
    "Step {current_step}. Recent history:{history}\nObservation: {observation}\n"
    "Admissible actions:{admissible}\nTask: {task}\nAnswer with <action> </action>."
)
COMPACT_LAST_TEMPLATE_NO_HISTORY = (
    "Observation: {observation}\nAdmissible actions:{admissible}\nTask: {task}\nAnswer with <action> </action>."
)

SYSTEM_PROMPT = "You are a helpful assistant."
PRIVILEGED_PREFIX = "Full state:"  # what an asymmetric critic reads before the env's state text
ACTION_OPEN = "<action>"
ACTION_CLOSE = "</action>"

TEMPLATES: dict[str, tuple[str, str]] = {
    "household": (HOUSEHOLD_TEMPLATE, HOUSEHOLD_TEMPLATE_NO_HISTORY),
    "compact": (COMPACT_TEMPLATE, COMPACT_TEMPLATE_NO_HISTORY),
    "compact_near": (COMPACT_NEAR_TEMPLATE, COMPACT_NEAR_TEMPLATE_NO_HISTORY),
    "compact_last": (COMPACT_LAST_TEMPLATE, COMPACT_LAST_TEMPLATE_NO_HISTORY),
}


@dataclass
class HistoryEntry:
    """One past step shown in the prompt."""

    observation: str
    action: str


def render_prompt(
    template: str,
    *,
    task: str,
    observation: str,
    admissible: Sequence[str] | None,
    history: Sequence[HistoryEntry],
    step: int,
    history_window: int,
) -> str:
    """The user message of one turn.

    Args:
        template: a key of ``TEMPLATES``.
        task: the task instruction.
        observation: the current observation.
        admissible: admissible actions, or None when the env has no such list.
        history: all past (observation, action) pairs of the episode, oldest first.
        step: number of steps already taken.
        history_window: how many of the most recent pairs to show (0 = none).
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {sorted(TEMPLATES)}")
    with_history, without_history = TEMPLATES[template]
    # One action per line, no quotes: word-level tokenizers then see the same words as in actions.
    admissible_text = "".join(f"\n- {a}" for a in admissible) if admissible else " none"
    shown = list(history)[-history_window:] if history_window > 0 else []
    if step == 0 or not shown:
        return without_history.format(task=task, observation=observation, admissible=admissible_text)
    first = step - len(shown) + 1
    history_text = "".join(
        f"\nObservation {first + i}: {h.observation}\nAction {first + i}: {h.action}" for i, h in enumerate(shown)
    )
    return with_history.format(
        task=task,
        step=step,
        history_len=len(shown),
        history=history_text,
        current_step=step + 1,
        observation=observation,
        admissible=admissible_text,
    )


def _apply_chat_template(tokenizer, user_message: str, system_prompt: str | None) -> str:
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_message})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


_MARK = "\x00rspo-user-message\x00"


def chat_prompt_text(tokenizer, user_message: str, system_prompt: str | None = SYSTEM_PROMPT) -> str:
    """The chat-formatted prompt text, ending with the assistant generation prompt.

    The template is rendered once per (template, system prompt) around a marker, and the text
    around the marker is reused (rendering a Jinja template costs ~0.1 ms a prompt). That is
    done only after checking it reproduces the template exactly on sample messages (whitespace
    at both ends included); a template that alters the message is rendered every time.
    """
    cache = tokenizer.__dict__.setdefault("_rspo_chat_parts", {})
    key = (tokenizer.chat_template, system_prompt)
    if key not in cache:
        wrapped = _apply_chat_template(tokenizer, _MARK, system_prompt)
        parts = tuple(wrapped.split(_MARK)) if wrapped.count(_MARK) == 1 else None
        samples = ("a b", " x\n y ", "<action>go</action>", "")
        if parts is not None and any(
            _apply_chat_template(tokenizer, m, system_prompt) != parts[0] + m + parts[1] for m in samples
        ):
            parts = None
        cache[key] = parts
    parts = cache[key]
    if parts is None:
        return _apply_chat_template(tokenizer, user_message, system_prompt)
    return parts[0] + user_message + parts[1]


def chat_prompt_ids(tokenizer, user_message: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[int]:
    """Token ids of the chat-formatted prompt, ending with the assistant generation prompt."""
    return tokenizer(chat_prompt_text(tokenizer, user_message, system_prompt), add_special_tokens=False)["input_ids"]


def _words(text: str) -> set[str]:
    """The words of ``text`` as the tiny tokenizer splits them (``language_model.tiny_pre_tokenizer``)."""
    from rspo_lightning.language_model import tiny_pre_tokenizer

    return {word for word, _ in tiny_pre_tokenizer().pre_tokenize_str(text)}


def template_texts() -> list[str]:
    """Every fixed string the prompts use (to train a word-level tokenizer on).

    A template pair whose words all occur in the texts before it (``compact_near`` reorders
    ``compact``'s words) is left out: it adds no word to the vocabulary, and its counts would
    only reorder the tiny tokenizer's ids (the trainer ranks words by frequency), so every tiny
    run would start from other weights than the runs recorded before it was added."""
    texts = [SYSTEM_PROMPT, PRIVILEGED_PREFIX]
    known = set().union(*map(_words, texts))
    for pair in TEMPLATES.values():
        words = set().union(*map(_words, pair))
        if not words <= known:
            texts.extend(pair)
            known |= words
    texts.append("- Observation 1: Action 1:")
    return texts


_TRUNCATION_WARNED = False


def build_turn_prompt(
    tokenizer,
    rollout_cfg,
    info: dict,
    observation: str,
    history: Sequence[HistoryEntry],
    step: int,
    max_tokens: int | None = None,
) -> list[int]:
    """Prompt token ids of one turn, exactly as the rollout engine builds them.

    When the prompt would exceed ``max_tokens`` it first shows fewer history pairs, then cuts the
    observation in the middle (" [...] "), with a one-time warning; as a last resort it keeps the
    last ``max_tokens`` ids (the generation prompt is at the end). Never raises for length.

    Args:
        tokenizer: the policy's tokenizer (chat template applied).
        rollout_cfg: a ``RolloutConfig`` (template, history_window, system_prompt are used).
        info: the env's info dict of the current state (``task``, ``admissible_actions``).
        observation: the current observation.
        history: every past (observation, action) pair of the episode, oldest first.
        step: number of turns already taken.
        max_tokens: the most prompt tokens the model can take (context - max_new_tokens); None = no limit.
    """
    global _TRUNCATION_WARNED

    def render(window: int, obs: str) -> list[int]:
        return tokenizer(
            _turn_text(tokenizer, rollout_cfg, info, obs, history, step, window), add_special_tokens=False
        )["input_ids"]

    window = rollout_cfg.history_window
    ids = render(window, observation)
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    while window > 0 and len(ids) > max_tokens:
        window -= 1
        ids = render(window, observation)
    if len(ids) <= max_tokens:
        return ids
    if not _TRUNCATION_WARNED:
        _TRUNCATION_WARNED = True
        warnings.warn(
            f"a prompt exceeds the model's context ({len(ids)} > {max_tokens} tokens) even without history; "
            "cutting the observation in the middle (shown once). Raise the context or shorten observations.",
            stacklevel=2,
        )
    obs, mark = observation, " [...] "
    while len(ids) > max_tokens and obs:
        # Shrink geometrically (few re-renders even for huge texts) and strictly (always ends).
        keep = max(0, int(len(obs) * 0.75) - len(mark))
        obs = obs[: keep // 2] + mark + obs[len(obs) - (keep - keep // 2) :] if keep else ""
        ids = render(0, obs)
    return ids[-max_tokens:] if len(ids) > max_tokens else ids


def encode_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=False)["input_ids"]``, tokenising each distinct text
    once (a group's episodes often share a prompt).

    A fast tokenizer whose Rust backend is set as Hugging Face's own call sets it (no padding, no
    truncation, the same special-token splitting) is called directly through ``encode_batch_fast``
    (the same ids, without the offsets nobody reads); any other tokenizer goes through its
    ``__call__``. Equal texts get the same list object: do not modify the rows in place.
    """
    unique = list(dict.fromkeys(texts))
    if not unique:
        return []
    backend = getattr(tokenizer, "_tokenizer", None)
    if (
        isinstance(backend, Tokenizer)
        and hasattr(backend, "encode_batch_fast")
        and backend.padding is None
        and backend.truncation is None
        and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        ids = [e.ids for e in backend.encode_batch_fast(unique, add_special_tokens=False)]
    else:
        ids = tokenizer(unique, add_special_tokens=False)["input_ids"]
    table = dict(zip(unique, ids))
    return [table[t] for t in texts]


def action_response_ids(tokenizer, action: str | Sequence[str]) -> list[int] | list[list[int]]:
    """Token ids of ``"<action> {action} </action>"`` (what constrained decoding emits; no eos);
    a list of actions gives a list of id lists, tokenised in one call."""
    if isinstance(action, str):
        return tokenizer(f"{ACTION_OPEN} {action} {ACTION_CLOSE}", add_special_tokens=False)["input_ids"]
    return encode_texts(tokenizer, [f"{ACTION_OPEN} {a} {ACTION_CLOSE}" for a in action])


def _turn_text(
    tokenizer, rollout_cfg, info: dict, observation: str, history: Sequence[HistoryEntry], step: int, window: int
) -> str:
    text = render_prompt(
        rollout_cfg.template,
        task=str(info.get("task", "")),
        observation=observation,
        admissible=info.get("admissible_actions"),
        history=history,
        step=step,
        history_window=window,
    )
    return chat_prompt_text(tokenizer, text, rollout_cfg.system_prompt or None)


def build_turn_prompts(
    tokenizer,
    rollout_cfg,
    turns: Sequence[tuple[dict, str, Sequence[HistoryEntry], int]],
    max_tokens: int | None = None,
) -> list[list[int]]:
    """``build_turn_prompt`` of many ``(info, observation, history, step)`` turns: the same ids,
    tokenised in one batched call (prompts over ``max_tokens`` are then shrunk one by one)."""
    texts = [_turn_text(tokenizer, rollout_cfg, *turn, rollout_cfg.history_window) for turn in turns]
    ids = encode_texts(tokenizer, texts)
    return [
        row
        if max_tokens is None or len(row) <= max_tokens
        else build_turn_prompt(tokenizer, rollout_cfg, *turn, max_tokens)
        for row, turn in zip(ids, turns)
    ]
