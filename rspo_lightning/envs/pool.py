"""EnvPool: the environments of one env id, reset and stepped many at a time.

``num_workers=0`` keeps the envs in this process (the embedded envs step in microseconds, so a
process hop would cost more than it saves). ``num_workers=W`` spreads them over ``W`` worker
processes (env ``i`` lives in worker ``i % W``) and steps the workers' shares in parallel: for
slow real environments (ALFWorld's reset costs 0.2-0.5 s) and for environments that may crash
the process they run in.

gymnasium's vector envs do not fit this loop: every env here resets with its own task
(``options`` per env), only the envs of still-active episodes are stepped each turn, and one
env's fault must cost only its episode. So this is a small process pool of its own.

Faults never raise out of ``reset``/``step``: each call's result is either the env's return
value, checked for types, or an :class:`EnvFault`. A faulty env (it raised, returned values of
the wrong types, or took longer than ``timeout_s``) is rebuilt at once. A worker process that
dies (or stops answering for ``timeout_s + grace_s``) is replaced; the episodes of all its envs
are lost with it (their state lived there), and a ``step`` on such an env before its next
``reset`` is a fault too. A hung call's thread is abandoned, not killed (Python cannot kill a
thread): in a worker it dies with the worker at ``close``.

Workers are started with ``spawn`` (safe next to torch's threads) and always closed: by
``close()``, by the context manager, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from rspo_lightning.envs.base import make_env

BUILD_TIMEOUT_S = 300.0  # a worker building envs (imports included) may take this long
WORKER_ENV_VAR = "RSPO_ENV_WORKER"
SPAWN_HINT = (
    "workers start with 'spawn', which re-imports the main script: a script that starts training must do so "
    'under `if __name__ == "__main__":` (the rspo-lightning command does)'
)  # set inside worker processes (FaultyEnv's "die" mode checks it)


class EnvFault(Exception):
    """An environment call raised, timed out, returned values of the wrong types, or lost its process."""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_reset(out) -> tuple[str, dict]:
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], dict)):
        raise EnvFault(f"reset returned {_short(out)}, expected (str, dict)")
    return out


def check_step(out) -> tuple:
    ok = isinstance(out, tuple) and len(out) == 5
    if ok:
        obs, reward, terminated, truncated, info = out
        ok = (
            isinstance(obs, str)
            and isinstance(reward, (int, float))
            and math.isfinite(float(reward))
            and isinstance(terminated, (bool, int))
            and isinstance(truncated, (bool, int))
            and isinstance(info, dict)
        )
    if not ok:
        raise EnvFault(f"step returned {_short(out)}, expected (str, finite number, bool, bool, dict)")
    return out


_CHECKS = {"reset": check_reset, "step": check_step}


class _TimedCaller:
    """Runs env calls on a daemon helper thread, each with a timeout; a call past its timeout is
    abandoned (its thread keeps running but, being a daemon, never holds up the process's exit).
    A batch of calls is one hand-off to the thread, not one per call."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue | None = None

    @staticmethod
    def _outcome(fn: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, fn()
        except Exception as exc:  # noqa: BLE001 - an env fault of any kind costs only its episode
            return False, exc

    @classmethod
    def _serve(cls, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            fns, results, cond = job
            for fn in fns:  # appends are atomic; the caller reads the finish times to time each call
                results.append((cls._outcome(fn), time.monotonic()))
            with cond:  # one wake-up per batch, not per call
                cond.notify()

    def run(self, fns: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Per call ``(True, return value)`` or ``(False, exception)``; a call that takes longer than
        the timeout (counted from the end of the previous one) gets ``(False, EnvFault)`` and the
        calls after it go on in a fresh thread."""
        if self.timeout_s is None:
            return [self._outcome(fn) for fn in fns]
        out: list[tuple[bool, Any]] = []
        while len(out) < len(fns):
            todo = fns[len(out) :]
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._jobs,), name="env-call", daemon=True).start()
            results: list[tuple[tuple[bool, Any], float]] = []
            cond = threading.Condition()
            with cond:
                start = time.monotonic()
                self._jobs.put((todo, results, cond))
                while len(results) < len(todo):
                    # the call now running started when the one before it finished
                    left = self.timeout_s - (time.monotonic() - (results[-1][1] if results else start))
                    if left <= 0:
                        break
                    cond.wait(left)
                done = [outcome for outcome, _ in results]
            out.extend(done)
            if len(done) < len(todo):  # stuck: leave that thread behind, the next calls get a fresh one
                self._jobs = None
                out.append((False, EnvFault(f"timed out after {self.timeout_s} s")))
        return out

    def shutdown(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def _bind(env, op: str, arg) -> Callable[[], Any]:
    if env is None:

        def missing():
            raise RuntimeError("the env could not be rebuilt after an earlier fault")

        return missing
    return (lambda: env.reset(options=arg)) if op == "reset" else (lambda: env.step(arg))


class _LocalEnvs:
    """The in-process side: a dict of envs and the calls on them (also what a worker runs)."""

    def __init__(self, env_id: str, env_kwargs: dict, timeout_s: float | None):
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self.envs: dict[int, Any] = {}
        self.call = _TimedCaller(timeout_s)

    def make(self, i: int) -> int | None:
        """Build env ``i`` (closing an old one); returns its ``max_steps``."""
        self.drop(i)
        env = self.envs[i] = make_env(self.env_id, **self.env_kwargs)
        return getattr(env.unwrapped, "max_steps", None)

    def drop(self, i: int) -> None:
        env = self.envs.pop(i, None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close too
                pass

    def run(self, calls: list[tuple[str, int, Any]]) -> list[tuple[bool, Any]]:
        """Per call (True, checked result) or (False, fault message); a faulty env is rebuilt."""
        outcomes = self.call.run([_bind(self.envs.get(i), op, arg) for op, i, arg in calls])
        replies = []
        for (op, i, _), (ok, value) in zip(calls, outcomes):
            if ok:
                try:
                    replies.append((True, _CHECKS[op](value)))
                    continue
                except EnvFault as fault:
                    message = str(fault)
            else:
                message = str(value) if isinstance(value, EnvFault) else f"{type(value).__name__}: {value}"
            try:
                self.make(i)
            except Exception as exc:  # noqa: BLE001 - rebuilt on the next reset instead
                self.envs.pop(i, None)
                message += f" (rebuilding the env failed too: {type(exc).__name__}: {exc})"
            replies.append((False, f"{op}: {message}"))
        return replies

    def close(self) -> None:
        for i in list(self.envs):
            self.drop(i)
        self.call.shutdown()


def _worker_main(conn, env_id: str, env_kwargs: dict, timeout_s: float | None, name: str) -> None:
    """A worker process: builds its envs and answers batches of calls, one message per call."""
    os.environ[WORKER_ENV_VAR] = name
    local = _LocalEnvs(env_id, env_kwargs, timeout_s)
    try:
        while True:
            try:
                batch = conn.recv()
            except (EOFError, OSError, KeyboardInterrupt):
                return
            if batch is None:
                return
            for op, i, arg in batch:
                if op == "make":
                    try:
                        reply = (i, True, local.make(i))
                    except Exception as exc:  # noqa: BLE001
                        reply = (i, False, f"make: {type(exc).__name__}: {exc}")
                else:  # one call at a time: a reply per call keeps the pool's liveness check per call
                    ((ok, value),) = local.run([(op, i, arg)])
                    reply = (i, ok, value)
                try:
                    conn.send(reply)
                except Exception as exc:  # noqa: BLE001 - an unpicklable return value is a fault too
                    local.make(i)
                    conn.send((i, False, f"{op}: its result could not be sent back: {type(exc).__name__}: {exc}"))
    finally:
        local.close()
        os._exit(0)  # at once: an abandoned (hung) env call must not hold the worker up


class EnvPool:
    """Envs of one id, called in batches; see the module docstring.

    Args:
        env_id: the registered environment id.
        env_kwargs: its ``gymnasium.make`` keyword arguments.
        num_workers: 0 = in this process; W > 0 = W worker processes.
        timeout_s: a reset/step taking longer is a fault (None = no limit).
        grace_s: a worker silent for ``timeout_s + grace_s`` is killed and replaced.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict | None = None,
        *,
        num_workers: int = 0,
        timeout_s: float | None = 60.0,
        grace_s: float = 10.0,
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = envs in this process), got {num_workers}")
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.num_workers, self.timeout_s, self.grace_s = num_workers, timeout_s, grace_s
        self.max_steps: list[int | None] = []  # per env, for the rollout's turn cap
        self.rebuilds = 0  # envs rebuilt after a fault
        self.worker_restarts = 0
        self._lost: set[int] = set()  # envs whose episode died with its worker: step faults until reset
        self._closed = False
        self._local = _LocalEnvs(env_id, self.env_kwargs, timeout_s) if num_workers == 0 else None
        self._ctx = mp.get_context("spawn")
        self._workers: list[tuple[Any, Any] | None] = [None] * num_workers  # (process, connection)
        for w in range(num_workers):
            self._start_worker(w)
        _open_pools.add(self)

    # -- size ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.max_steps)

    def ensure(self, n: int) -> None:
        """Grow the pool to at least ``n`` envs."""
        new = list(range(len(self.max_steps), n))
        if not new:
            return
        self.max_steps.extend([None] * len(new))
        if self._local is not None:
            for i in new:
                self.max_steps[i] = self._local.make(i)
            return
        for i, ok, value in self._batch([("make", i, None) for i in new]):
            if not ok:
                raise RuntimeError(f"could not build {self.env_id} in a worker: {value}; {SPAWN_HINT}")
            self.max_steps[i] = value

    # -- calls ---------------------------------------------------------------------------
    def reset(self, calls: list[tuple[int, dict]]) -> list[tuple | EnvFault]:
        """``[(env index, reset options)]`` -> per call ``(observation, info)`` or an EnvFault."""
        results = self._run([("reset", i, options) for i, options in calls])
        for (i, _), r in zip(calls, results):
            if not isinstance(r, EnvFault):
                self._lost.discard(i)
        return results

    def step(self, calls: list[tuple[int, str]]) -> list[tuple | EnvFault]:
        """``[(env index, action)]`` -> per call the 5-tuple of ``step`` or an EnvFault."""
        lost = {i for i, _ in calls if i in self._lost}
        results = self._run([("step", i, a) for i, a in calls if i not in lost])
        it = iter(results)
        return [
            EnvFault("step: its worker process died; the env was rebuilt and its episode lost")
            if i in lost
            else next(it)
            for i, _ in calls
        ]

    def _run(self, calls: list[tuple[str, int, Any]]) -> list[tuple | EnvFault]:
        if self._closed:
            raise RuntimeError(f"EnvPool({self.env_id}) is closed")
        if self._local is not None:
            replies = [(i, *r) for (_, i, _), r in zip(calls, self._local.run(calls))]
        else:
            replies = self._batch(calls)
        out = []
        for _, ok, value in replies:
            if not ok:
                self.rebuilds += 1
                value = EnvFault(value)
            out.append(value)
        return out

    # -- workers -------------------------------------------------------------------------
    def _start_worker(self, w: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.env_id, self.env_kwargs, self.timeout_s, f"{w}.{self.worker_restarts}"),
            name=f"rspo-env-{w}",
            daemon=True,
        )
        proc.start()
        child.close()
        self._workers[w] = (proc, parent)

    def _replace_worker(self, w: int) -> None:
        """Kill worker ``w`` and start a fresh one with fresh envs; their episodes are lost."""
        proc, conn = self._workers[w]
        proc.kill()
        proc.join(timeout=5)
        conn.close()
        self.worker_restarts += 1
        self._start_worker(w)
        mine = [i for i in range(len(self.max_steps)) if i % self.num_workers == w]
        self._lost.update(mine)
        _, conn = self._workers[w]
        conn.send([("make", i, None) for i in mine])
        for _ in mine:
            try:
                if not conn.poll(BUILD_TIMEOUT_S):
                    raise TimeoutError(f"no answer within {BUILD_TIMEOUT_S} s")
                conn.recv()
            except (EOFError, OSError) as exc:
                raise RuntimeError(
                    f"a replacement worker for {self.env_id} could not build its envs ({type(exc).__name__}: {exc}); "
                    f"{SPAWN_HINT}"
                ) from exc

    @property
    def worker_pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._workers]

    def _batch(self, calls: list[tuple[str, int, Any]]) -> list[tuple[int, bool, Any]]:
        """Send each worker its share of ``calls``; gather one reply per call, in call order."""
        W = self.num_workers
        shares: dict[int, list[int]] = {}
        for k, (_, i, _) in enumerate(calls):
            shares.setdefault(i % W, []).append(k)
        replies: list[tuple[int, bool, Any] | None] = [None] * len(calls)
        limit = (self.timeout_s or 3600.0) + self.grace_s
        if any(op == "make" for op, _, _ in calls):  # a new worker first imports the env's packages
            limit = max(limit, BUILD_TIMEOUT_S)
        pending: dict[int, list[int]] = {}
        for w, ks in shares.items():
            try:
                self._workers[w][1].send([calls[k] for k in ks])
                pending[w] = list(ks)
            except (OSError, ValueError):  # already dead
                pending[w] = list(ks)
                self._fail_worker(w, pending, calls, replies, "its worker process died (found when sending it work)")
        deadline = {w: time.monotonic() + limit for w in pending}
        while pending:
            conns = {self._workers[w][1]: w for w in pending}
            wait_s = max(0.0, min(deadline[w] for w in pending) - time.monotonic())
            for conn in mp.connection.wait(list(conns), timeout=wait_s):
                w = conns[conn]
                try:
                    i, ok, value = conn.recv()
                except (EOFError, OSError):
                    self._workers[w][0].join(timeout=1)
                    code = self._workers[w][0].exitcode
                    self._fail_worker(w, pending, calls, replies, f"its worker process died (exit code {code})")
                    continue
                k = pending[w].pop(0)
                replies[k] = (i, ok, value)
                deadline[w] = time.monotonic() + limit
                if not pending[w]:
                    del pending[w]
            now = time.monotonic()
            for w in [w for w in pending if deadline[w] <= now]:
                self._fail_worker(w, pending, calls, replies, f"its worker process did not answer for {limit:.0f} s")
        return replies  # type: ignore[return-value]

    def _fail_worker(self, w: int, pending: dict, calls: list, replies: list, why: str) -> None:
        """Worker ``w`` is gone: every call it had in this batch is a fault, answered or not (the
        state those calls left lived in the dead process); then it is replaced."""
        pending.pop(w, None)
        for k, (op, i, _) in enumerate(calls):
            if i % self.num_workers == w:
                replies[k] = (i, False, f"{op}: {why}; the env was rebuilt")
        self._replace_worker(w)

    # -- closing -------------------------------------------------------------------------
    def close(self) -> None:
        """Close every env and stop the workers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        _open_pools.discard(self)
        if self._local is not None:
            self._local.close()
        for entry in self._workers:
            if entry is None:
                continue
            proc, conn = entry
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
            conn.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_open_pools: weakref.WeakSet[EnvPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_open_pools):
        pool.close()
