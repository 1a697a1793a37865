"""Turn a model response into an environment action.

Format (docs/design.md §6): optional reasoning inside ``<think>...</think>``, exactly one action inside
``<action>...</action>``. Anything else is an invalid action: the caller charges the
invalid-action penalty and the environment receives an empty action ("Nothing happens.").
Parsing never raises, whatever the text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
_SPACE_RE = re.compile(r"\s+")

# Longest action text we accept; longer text inside the tag is treated as garbage.
MAX_ACTION_CHARS = 500


@dataclass(frozen=True)
class ParsedAction:
    """Result of parsing one response.

    Args:
        action: the action to send to the environment ("" when the response had no usable action);
            when admissible actions are known, the admissible spelling of it.
        valid: True when the format is right (and the action admissible, when required).
        reason: ``"ok"``, ``"missing_action_tag"``, ``"multiple_actions"``, ``"empty_action"``,
            ``"action_too_long"``, ``"missing_think"`` or ``"not_admissible"``.
        think: the reasoning text, if any.
    """

    action: str
    valid: bool
    reason: str
    think: str = ""


def normalize_action(text: str) -> str:
    """Lower-case, collapse white space, strip: the form actions are compared in."""
    return _SPACE_RE.sub(" ", text).strip().lower()


def parse_response(
    text: object,
    admissible: Sequence[str] | None = None,
    *,
    require_admissible: bool = True,
    require_think: bool = False,
) -> ParsedAction:
    """Extract the action from a response; never raises.

    Args:
        text: the decoded response (anything that is not a str is invalid).
        admissible: the environment's admissible actions, or None when it has none.
        require_admissible: an action not in ``admissible`` is invalid (when ``admissible`` given).
        require_think: a response without a ``<think>`` block is invalid.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return ParsedAction("", False, "missing_action_tag")
    actions = _ACTION_RE.findall(text)
    think_match = _THINK_RE.search(text)
    think = think_match.group(1).strip() if think_match else ""
    if not actions:
        return ParsedAction("", False, "missing_action_tag", think)
    if len(actions) > 1:
        return ParsedAction("", False, "multiple_actions", think)
    raw = actions[0]
    if len(raw) > MAX_ACTION_CHARS:
        return ParsedAction("", False, "action_too_long", think)
    action = normalize_action(raw)
    if not action:
        return ParsedAction("", False, "empty_action", think)
    if require_think and think_match is None:
        return ParsedAction(action, False, "missing_think", think)
    if admissible is not None:
        by_norm = {normalize_action(a): a for a in admissible}
        if action in by_norm:
            return ParsedAction(by_norm[action], True, "ok", think)
        if require_admissible:
            return ParsedAction(action, False, "not_admissible", think)
    return ParsedAction(action, True, "ok", think)
