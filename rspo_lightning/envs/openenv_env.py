"""OpenEnv: adapter to any OpenEnv environment (`openenv-core`; the env format TRL, SkyRL, TorchRL,
AgileRL and Unsloth take), served or in-process.

`make_env("rspo/OpenEnv-v0", base_url="http://127.0.0.1:8000")` plays a running OpenEnv server;
`make_env("rspo/OpenEnv-v0", env_class="my_env.server:MyEnvironment")` builds the
`openenv.core.Environment` subclass in this process instead (no server). Both give the same
episodes: an observation is read as the same dict in both modes, the fields of the env's
`Observation` model without `reward`, `done` and `metadata` (what OpenEnv's server sends).

Served: each env holds one session of OpenEnv's WebSocket protocol (`/ws`: `reset`, `step` and
`close` messages, the protocol of OpenEnv's own `EnvClient`), opened by its first `reset` and kept
for every episode (one server-side env instance, as OpenEnv's clients use it) until `close()`.
The server must allow as many sessions as the trainer holds envs, one per episode played at once
(`data.groups_per_iteration` x `data.group_size`, or `data.val_groups_per_batch` if larger) plus
one: serve it with `create_app(MyEnvironment, MyAction, MyObservation, max_concurrent_envs=N)`
and `SUPPORTS_CONCURRENT_SESSIONS = True` on the class. The client is ours (`websockets`' sync
client, ~40 lines) rather than OpenEnv's `GenericEnvClient`: importing `openenv.core` imports
gradio (8.7 s measured here, against ~0.1 s), and its sync wrapper runs an event-loop thread per env.

Mapping to the TextEnv contract (docs/environments_byo.md):

- text: `formatter(observation_dict)` when given, else the field `text_field`, else the
  observation's only string field;
- `task`: the field `task_field`, else the episode's first observation text;
- `admissible_actions`: the field `actions_field` (a list; its items as text) or None (free-form).
  A listed action is sent as the env listed it (an int stays an int); an action that is not
  listed never reaches the env: "Nothing happens.", `invalid=True`. Free-form actions are sent as
  the text the policy wrote; one the env's Action model rejects (a validation error) is invalid
  too and leaves the state unchanged;
- actions go into the Action model's field `action_field` (default: its only required field, else
  its only string field);
- `reward`: the env's reward as it is (None -> 0.0); `won`: the bool field `won_field`, else
  "the episode ended with a reward > 0"; the episode terminates when the env says `done` (or won);
- `score`: the sum of the env's rewards so far; `progress`: the field `progress_field` clipped to
  [0, 1], else 1.0 once won and 0.0 before;
- `anchor`: the field `anchor_field`, else a hash of every observation and action of the episode
  (equal only for equal histories: never merges two different states of a deterministic env);
- tasks: `reset(options={"split", "task_id"})` sends `seed = splits.index(split) x tasks_per_split
  + task_id` (disjoint seeds per split), `episode_id = "<split>-<task_id>"` and `reset_kwargs`;
  the env's `reset` receives those its signature takes (as OpenEnv's server does).

`openenv-core` is only needed for `env_class` (and to serve an env); importing `rspo_lightning`
never needs it (`pip install -e ".[openenv]"`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import typing
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from gymnasium.envs.registration import load_env_creator

from rspo_lightning.envs.base import DEFAULT_SPLITS, TextEnv, normalize_action, text_anchor

#: Observation model fields OpenEnv's server sends apart from the observation dict.
RESERVED_FIELDS = ("reward", "done", "metadata")
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
_SERVE_HINT = (
    "serve your env with openenv's create_app (e.g. `uvicorn my_env.server.app:app --port 8000`), "
    "or pass env_class='module:Class' to run it in this process"
)


def load_object(path: Any, what: str) -> Any:
    """``"module:attr"`` -> the object (a non-string is returned as is); ValueError naming ``what`` when it fails."""
    if not isinstance(path, str):
        return path
    if ":" not in path:
        raise ValueError(f"{what} must be 'module:attr', got {path!r}")
    try:
        return load_env_creator(path)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {path!r} cannot be loaded: {exc}") from exc


def _import_websocket_client():
    try:
        from websockets.sync.client import connect
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "rspo/OpenEnv-v0 with base_url needs the websockets package (openenv-core brings it): "
            "pip install 'rspo_lightning[openenv]'"
        ) from exc
    return connect


class ServerError(RuntimeError):
    """An error answer of an OpenEnv server (`code` is OpenEnv's WSErrorCode value)."""

    def __init__(self, code: str, message: str, data: dict[str, Any]):
        super().__init__(f"{message} (code: {code})")
        self.code, self.data = code, data


class OpenEnvSession:
    """One WebSocket session of an OpenEnv server: JSON messages in, the answer's ``data`` out."""

    def __init__(self, base_url: str, timeout_s: float):
        connect = _import_websocket_client()
        self.url = ws_url(base_url) + "/ws"
        self.timeout_s = timeout_s
        proxy = None if urllib.parse.urlsplit(self.url).hostname in _LOOPBACK_HOSTS else True
        self._stack = contextlib.ExitStack()  # websockets >= 17.1 wants connect() used as a context manager
        try:
            self._ws = self._stack.enter_context(
                # no keepalive thread: every answer is awaited with a timeout anyway
                connect(self.url, open_timeout=timeout_s, max_size=2**27, ping_interval=None, proxy=proxy)
            )
        except Exception as exc:  # noqa: BLE001 - refused, timed out, not a WebSocket endpoint
            raise ConnectionError(f"cannot open a session at {self.url}: {exc}; {_SERVE_HINT}") from exc

    def request(self, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        message = {"type": kind} if data is None else {"type": kind, "data": data}
        try:
            self._ws.send(json.dumps(message))
        except ConnectionClosed:  # a server that refused the session closes it after its error answer: read that
            pass
        try:
            answer = json.loads(self._ws.recv(timeout=self.timeout_s))
        except ConnectionClosed as exc:
            raise ConnectionError(f"the OpenEnv server closed the session at {self.url}: {exc}") from exc
        if answer.get("type") == "error":
            info = answer.get("data") or {}
            raise ServerError(str(info.get("code", "UNKNOWN")), str(info.get("message", "")), info)
        return answer.get("data") or {}

    def close(self) -> None:
        """Ask the server to end the session and wait until it closes the connection (closing first
        makes OpenEnv's server log a traceback for its own close of a closed socket)."""
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(json.dumps({"type": "close"}))
            while True:
                self._ws.recv(timeout=min(self.timeout_s, 5.0))
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            self._stack.close()


def ws_url(base_url: str) -> str:
    """``http(s)://host:port`` (or ``ws(s)://``, or a bare ``host:port``) -> ``ws(s)://host:port``."""
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            return ws + url[len(http) :]
    return url if url.startswith(("ws://", "wss://")) else "ws://" + url


def http_url(base_url: str) -> str:
    url = ws_url(base_url)
    return ("https://" + url[6:]) if url.startswith("wss://") else ("http://" + url[5:])


def fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    """The server's ``GET /schema`` (JSON schemas of its action and observation models)."""
    url = http_url(base_url) + "/schema"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError, refused, timeout, not JSON
        raise ConnectionError(f"no OpenEnv server answers at {base_url!r} ({url}: {exc}); {_SERVE_HINT}") from exc


def action_field_of(schema: dict[str, Any], wanted: str | None) -> str:
    """The Action model's field the action text goes into: ``wanted`` (checked), else the model's
    only required field, else its only string field."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    if wanted is not None:
        if wanted not in props:
            raise ValueError(f"action_field {wanted!r} is not a field of the env's Action; it has {sorted(props)}")
        return wanted
    required = [k for k in schema.get("required") or [] if k in props]
    strings = [k for k, v in props.items() if _is_string(v)]
    for candidates in (required, strings):
        if len(candidates) == 1:
            return candidates[0]
    raise ValueError(
        f"cannot tell which field of the env's Action takes the action text (fields {sorted(props)}); "
        "pass action_field=<name>"
    )


def _is_string(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "string" or any(p.get("type") == "string" for p in prop.get("anyOf", []))


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes (all of them when it has ``**kwargs``), as OpenEnv's server filters them."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def _action_class_of(env_cls: type) -> type | None:
    """The Action model of an ``Environment`` subclass: its ``step``'s annotation, else the first
    argument of its ``Environment[Action, Observation, State]`` base."""
    try:
        hint = typing.get_type_hints(env_cls.step).get("action")
    except Exception:  # noqa: BLE001 - unresolvable annotations: try the generic base
        hint = None
    if isinstance(hint, type) and hasattr(hint, "model_json_schema"):
        return hint
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type) and hasattr(args[0], "model_json_schema"):
                return args[0]
    return None


class OpenEnv(TextEnv):
    """Adapter to an OpenEnv environment (module docstring; docs/environments_byo.md).

    Args:
        base_url: URL of a running OpenEnv server (``http://host:port``; ``ws://`` works too).
        env_class: ``"module:Class"`` of an ``openenv.core.Environment`` subclass to run in this
            process instead (exactly one of ``base_url`` and ``env_class``).
        env_kwargs: keyword arguments of ``env_class``.
        action_class: ``"module:Class"`` of its Action model (default: read from ``env_class``).
        action_field: the Action field that gets the action (default: the only required field,
            else the only string field).
        text_field: the observation field shown as the observation (default: the only string field).
        formatter: ``"module:function"`` turning the observation dict into the text, instead of ``text_field``.
        task_field: the observation field holding the instruction (default: the first observation's text).
        actions_field: the observation field listing the admissible actions (default: none, free-form).
        won_field: the bool observation field saying the episode is won (default: ended with reward > 0).
        progress_field: the observation field with task progress in [0, 1] (default: 1 when won).
        anchor_field: the observation field that keys the state (default: a hash of the episode's history).
        reset_kwargs: extra keyword arguments of every ``reset`` (e.g. a difficulty).
        splits: task split names; split ``i`` plays seeds ``i * tasks_per_split + task_id``.
        tasks_per_split: tasks (seeds) per split.
        max_steps: steps (valid or not) before the episode is truncated.
        task_type: the ``task_type`` reported (per-type success rates).
        timeout_s: seconds to wait for the server (connect, each answer).
        render_mode: None or "ansi".
    """

    def __init__(
        self,
        base_url: str | None = None,
        env_class: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        action_class: str | None = None,
        action_field: str | None = None,
        text_field: str | None = None,
        formatter: str | None = None,
        task_field: str | None = None,
        actions_field: str | None = None,
        won_field: str | None = None,
        progress_field: str | None = None,
        anchor_field: str | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        splits: Sequence[str] = DEFAULT_SPLITS,
        tasks_per_split: int = 10_000,
        max_steps: int = 30,
        task_type: str = "openenv",
        timeout_s: float = 30.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if (base_url is None) == (env_class is None):
            raise ValueError(
                "rspo/OpenEnv-v0 needs exactly one of base_url (a running OpenEnv server, "
                f"e.g. 'http://127.0.0.1:8000') and env_class ('module:Class'); got base_url={base_url!r}, "
                f"env_class={env_class!r}"
            )
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if int(tasks_per_split) < 1:
            raise ValueError(f"tasks_per_split must be >= 1, got {tasks_per_split}")
        self.splits = tuple(splits)
        if not self.splits:
            raise ValueError("splits must name at least one split, got []")
        self.tasks_per_split, self.max_steps, self.timeout_s = int(tasks_per_split), int(max_steps), float(timeout_s)
        self.task_type = task_type
        self.text_field, self.task_field, self.actions_field = text_field, task_field, actions_field
        self.won_field, self.progress_field, self.anchor_field = won_field, progress_field, anchor_field
        self.formatter = load_object(formatter, "formatter") if formatter is not None else None
        self.reset_kwargs = dict(reset_kwargs or {})
        self.base_url = base_url
        self._session: OpenEnvSession | None = None
        self._local = None
        if base_url is not None:
            if env_kwargs or action_class:
                raise ValueError("env_kwargs and action_class are for env_class; a server builds its own env")
            schema = fetch_schema(base_url, self.timeout_s)
            self.action_field = action_field_of(schema.get("action") or {}, action_field)
            fields = sorted(set((schema.get("observation") or {}).get("properties") or {}) - set(RESERVED_FIELDS))
            self._check_fields(fields, "the server's observation schema")
        else:
            env_cls = load_object(env_class, "env_class")
            self.action_class = load_object(action_class, "action_class") if action_class else _action_class_of(env_cls)
            if self.action_class is None:
                raise ValueError(
                    f"cannot read the Action model of {env_class!r} from its step() annotation or its "
                    "Environment[Action, Observation, State] base; pass action_class='module:Class'"
                )
            self.action_field = action_field_of(self.action_class.model_json_schema(), action_field)
            self._local = env_cls(**dict(env_kwargs or {}))
        # before the first reset the env holds a finished, empty episode
        self._done, self._ended, self._won, self._truncated, self._steps = True, False, False, False, 0
        self._task, self._text, self._fields, self._score, self._progress = "", "", {}, 0.0, 0.0
        self._admissible: dict[str, Any] = {}
        self._history: list[str] = []

    # -- TextEnv contract -----------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        self.check_split(split)
        return self.tasks_per_split

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task ``options["task_id"]`` of ``options["split"]`` (module docstring: the seed sent)."""
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        task_id = self.check_task_id(split, task_id)
        kwargs = {
            **self.reset_kwargs,
            "seed": self.splits.index(split) * self.tasks_per_split + task_id,
            "episode_id": f"{split}-{task_id}",
        }
        if self._local is not None:
            observation = self._local.reset(**_accepted(self._local.reset, kwargs))
            fields, reward, done = self._dump(observation)
        else:
            fields, reward, done = self._request("reset", kwargs)
        self._steps, self._truncated, self._score = 0, False, 0.0
        self._history = []
        self._task = ""
        self._update(fields, reward, done)
        self._task = str(self._field(fields, self.task_field)) if self.task_field else self._text
        return self._observe(self._text), self._info(False)

    def step(self, action: Any):
        if self._done:
            return self._invalid()
        if self.actions_field is not None:
            if normalize_action(action) not in self._admissible:
                return self._invalid()
            value = self._admissible[normalize_action(action)]
        elif isinstance(action, str) and action.strip():
            value = action.strip()
        else:
            return self._invalid()
        if self._local is not None:
            try:
                payload = self.action_class(**{self.action_field: value})
            except ValueError:  # pydantic's ValidationError: the Action model rejects it
                return self._invalid()
            fields, reward, done = self._dump(self._local.step(payload))
        else:
            try:
                fields, reward, done = self._request("step", {self.action_field: value})
            except ServerError:  # the server's Action model rejected it; nothing was stepped
                return self._invalid()
            except Exception:
                self._done, self._admissible = True, {}  # the episode is lost with its session: reset next
                raise
        self._steps += 1
        self._history.append(f"> {value}")
        self._update(fields, reward, done)
        self._truncated = not self._done and self._steps >= self.max_steps
        if self._truncated:
            self._done = True
            self._admissible = {}
        return self._observe(self._text), float(reward), self._ended, self._truncated, self._info(False)

    def expert_action(self) -> str:
        raise NotImplementedError("an OpenEnv environment has no expert here")

    def close(self) -> None:
        self._end_session()
        if self._local is not None:
            self._local.close()
        super().close()

    def __del__(self) -> None:  # an env dropped without close() must not keep a server session open
        try:
            self._end_session()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- internals ------------------------------------------------------------------------------

    def _request(self, kind: str, data: dict[str, Any]) -> tuple[dict[str, Any], float, bool]:
        """One message to the server on this env's session (opened by the first reset and kept for
        every episode: one server-side env, as OpenEnv's own clients do). Raises ServerError for a
        rejected action, RuntimeError for any other error answer; an error ends the session."""
        if self._session is None:
            self._session = OpenEnvSession(self.base_url, self.timeout_s)
        try:
            return self._answer(self._session.request(kind, data))
        except ServerError as exc:
            if exc.code == "VALIDATION_ERROR" and kind == "step":
                raise
            self._end_session()
            raise RuntimeError(self._server_error_text(exc)) from exc
        except Exception:
            self._end_session()  # a broken connection: the next reset opens a new session
            raise

    def _end_session(self) -> None:
        session, self._session = getattr(self, "_session", None), None
        if session is not None:
            session.close()

    def _server_error_text(self, exc: ServerError) -> str:
        if exc.code == "CAPACITY_REACHED":
            return (
                f"the OpenEnv server at {self.base_url!r} already holds its maximum of "
                f"{exc.data.get('max_sessions')} sessions; serve it with create_app(..., max_concurrent_envs=N) "
                "for N >= the episodes played at once (data.groups_per_iteration x data.group_size) and "
                "SUPPORTS_CONCURRENT_SESSIONS = True on the env class, or play fewer episodes at once"
            )
        return f"the OpenEnv server at {self.base_url!r} answered with an error: {exc}"

    @staticmethod
    def _answer(data: dict[str, Any]) -> tuple[dict[str, Any], float, bool]:
        return dict(data.get("observation") or {}), float(data.get("reward") or 0.0), bool(data.get("done", False))

    @staticmethod
    def _dump(observation: Any) -> tuple[dict[str, Any], float, bool]:
        """An in-process Observation as the server would send it (JSON types, reserved fields apart)."""
        fields = observation.model_dump(mode="json", exclude=set(RESERVED_FIELDS))
        return fields, float(observation.reward or 0.0), bool(observation.done)

    def _check_fields(self, fields: Sequence[str], where: str) -> None:
        for name in ("text_field", "task_field", "actions_field", "won_field", "progress_field", "anchor_field"):
            value = getattr(self, name)
            if value is not None and value not in fields:
                raise ValueError(f"{name} {value!r} is not a field of {where}; it has {list(fields)}")

    def _field(self, fields: dict[str, Any], name: str) -> Any:
        if name not in fields:
            raise ValueError(f"the observation has no field {name!r}; it has {sorted(fields)}")
        return fields[name]

    def _text_of(self, fields: dict[str, Any]) -> str:
        if self.formatter is not None:
            return str(self.formatter(fields))
        if self.text_field is not None:
            return str(self._field(fields, self.text_field))
        strings = [k for k, v in fields.items() if isinstance(v, str)]
        if len(strings) != 1:
            raise ValueError(
                f"the observation has {len(strings)} string fields {strings} (all fields: {sorted(fields)}); "
                "pass text_field=<name> or formatter='module:function'"
            )
        return fields[strings[0]]

    def _update(self, fields: dict[str, Any], reward: float, done: bool) -> None:
        if not self._fields:  # the first observation of this env: check the configured names once
            self._check_fields(sorted(fields), "the env's observation")
        self._fields = fields
        self._text = self._text_of(fields)
        self._history.append(self._text)
        self._score += reward
        self._won = bool(self._field(fields, self.won_field)) if self.won_field else (done and reward > 0)
        self._ended = done or self._won
        self._done = self._ended
        if self.progress_field is not None:
            self._progress = min(1.0, max(0.0, float(self._field(fields, self.progress_field) or 0.0)))
        else:
            self._progress = 1.0 if self._won else 0.0
        listed = self._field(fields, self.actions_field) if self.actions_field and not self._done else []
        self._admissible = {normalize_action(str(a)): a for a in listed or []}

    def _info(self, invalid: bool) -> dict[str, Any]:
        if self.anchor_field is not None and self._fields:
            anchor = str(self._field(self._fields, self.anchor_field))
        else:
            anchor = text_anchor("oe:", [self._task, *self._history])
        return {
            "task": self._task,
            "task_type": self.task_type,
            "admissible_actions": [str(a) for a in self._admissible.values()] if self.actions_field else None,
            "anchor": anchor,
            "privileged": None,
            "won": self._won,
            "score": self._score,
            "progress": self._progress,
            "invalid": invalid,
        }

    def _terminated(self) -> bool:
        """The env said ``done`` (or the episode was won); TextEnv._invalid's "Nothing happens." reports it."""
        return self._ended
