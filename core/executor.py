"""Executors of sweeps: many independent units, run one after another here or on Ray workers.

Graft sweeps, evaluations of many checkpoints and GRPO grids are lists of frozen, serialisable specs. An
:class:`Executor` is picked once from the command's flags and gives a pool with one interface for every kind:
``--executor serial`` (the default) runs the units in this process (:class:`SerialPool`) and never imports
Ray; ``--executor ray`` hands them to a :class:`WorkerPool`: one long-lived Ray actor per worker; ``processes``
(the study's runs on this machine's cores) to a :class:`ProcessPool` of spawned worker processes. Either
way each worker's state is built once by a ``setup`` callable, in the worker's own process (e.g. a graft
sweep's opened checkpoints and loaded base policy), then fed one unit at a time as it frees up. The
driver receives ``(index, result)`` as each unit finishes, so it writes partial results the same way
whichever executor runs them. This module runs callables and knows nothing of what they compute (a leaf:
Ray and torch are imported lazily).

- ``--ray-address local`` starts a cluster on this machine (its CPUs, or ``--workers`` where that is more;
  the GPUs Ray sees) and shuts it down afterwards; ``auto`` joins the running cluster; ``HOST:PORT`` (or
  ``ray://HOST:PORT``) the cluster there. A Ray session already initialised in this process is reused,
  and left running.
- Workers: ``--workers``, else one per GPU when each worker takes a GPU, else one per CPU of the cluster;
  never more than there are units. Each worker holds one CPU (and one GPU with a CUDA ``--device``; with
  ``auto`` a GPU where the cluster has one), runs torch on one thread, and sees this process's offline
  and cache settings (:data:`FORWARDED_ENV`).
- A GPU request on a cluster without GPUs is an error before anything is scheduled (Ray would leave the
  actors pending for ever).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from .config import EXECUTORS
from .errors import GraftkitError

#: Environment variables (exact names, or prefixes ending in ``_``) each Ray worker inherits from the driver.
FORWARDED_ENV = ("HF_", "TRANSFORMERS_", "TOKENIZERS_PARALLELISM", "GRAFTKIT_", "SE_OFFLINE", "MINIWOB_")
#: Threads each worker's torch uses: the workers share the machine's cores.
WORKER_THREADS = 1
#: The executors: the command line's (:data:`.config.EXECUTORS`: serial, ray), and ``processes``, worker processes on
#: this machine, for units that pickle as plain data (the study's runs: their frozen configs).
KINDS = (*EXECUTORS, "processes")


def ray_module():
    """The ``ray`` package, or the one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise GraftkitError("--executor ray needs Ray", "pip install 'graftkit[ray]'") from None
    return ray


def worker_env() -> dict[str, str]:
    """The environment variables passed on to every worker (:data:`FORWARDED_ENV`), one thread each."""
    env = {k: v for k, v in os.environ.items()
           if any(k.startswith(p) if p.endswith("_") else k == p for p in FORWARDED_ENV)}
    return {**env, "OMP_NUM_THREADS": str(WORKER_THREADS), "MKL_NUM_THREADS": str(WORKER_THREADS)}


@dataclass
class Cluster:
    """A connected Ray cluster: its resources (``CPU``, ``GPU``, ...), the address asked for, and the
    seconds connecting took (starting a local cluster included)."""

    address: str
    resources: dict[str, float]
    seconds: float
    started: bool = False

    @property
    def cpus(self) -> int:
        return int(self.resources.get("CPU", 0))

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0))


@contextlib.contextmanager
def ray_cluster(address: str = "local", workers: int | None = None) -> Iterator[Cluster]:
    """Connect to the Ray cluster ``address`` names (see the module docstring) for the ``with`` block."""
    ray = ray_module()
    t0 = time.perf_counter()
    if ray.is_initialized():  # e.g. a session a test suite or a notebook started: reuse it, leave it up
        yield Cluster(address, dict(ray.cluster_resources()), time.perf_counter() - t0)
        return
    common = dict(log_to_driver=False, runtime_env={"env_vars": worker_env()}, configure_logging=False)
    temp = None
    if address == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private cluster needs no token in ~/.ray
        temp = tempfile.mkdtemp(prefix="graftkit-ray-")
        ray.init(num_cpus=max(workers or 0, os.cpu_count() or 1), include_dashboard=False, _temp_dir=temp,
                 **common)
    else:
        try:
            ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise GraftkitError(f"--ray-address {address}: cannot connect to a Ray cluster "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                                "start one (ray start --head) or use --ray-address local") from None
    try:
        yield Cluster(address, dict(ray.cluster_resources()), time.perf_counter() - t0, started=True)
    finally:
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def wants_gpu(device: str, cluster: Cluster) -> bool:
    """Whether each worker takes a GPU for ``device``: ``cuda``/``cuda:N`` yes (an error when the cluster
    has none), ``auto`` where the cluster has GPUs, ``cpu`` no."""
    if device.startswith("cuda"):
        if cluster.gpus < 1:
            res = ", ".join(f"{k} {v:g}" for k, v in sorted(cluster.resources.items()) if k in ("CPU", "GPU", "memory"))
            raise GraftkitError(f"--device {device} with --executor ray: the Ray cluster ({cluster.address}) has no GPU "
                                f"({res or 'no resources'})",
                                "use --device cpu (or auto), --executor serial, or a --ray-address with GPUs")
        return True
    return device == "auto" and cluster.gpus > 0


def worker_device(device: str) -> str:
    """The device a worker runs ``device`` on: Ray gives a GPU worker one GPU, as ``cuda:0``
    (CUDA_VISIBLE_DEVICES), whatever N ``cuda:N`` named; ``auto`` and ``cpu`` are themselves."""
    return "cuda" if device.startswith("cuda") else device


def worker_count(cluster: Cluster, gpu: bool, units: int, workers: int | None = None) -> int:
    """How many workers: ``workers``, else one per GPU (``gpu``) or per CPU; at most ``units``, at least 1."""
    n = workers or (cluster.gpus if gpu else cluster.cpus) or 1
    # more workers than the cluster can place would wait for resources for ever
    if gpu and n > cluster.gpus:
        raise GraftkitError(f"--workers {n} with one GPU each: the Ray cluster ({cluster.address}) has "
                            f"{cluster.gpus} GPU(s)", f"pass --workers {cluster.gpus} or fewer")
    if n > cluster.cpus:
        raise GraftkitError(f"--workers {n} with one CPU each: the Ray cluster ({cluster.address}) has "
                            f"{cluster.cpus} CPU(s)", f"pass --workers {max(cluster.cpus, 1)} or fewer")
    return max(1, min(n, units))


class _Actor:
    """A worker: ``setup()`` once, then ``work(state, item)`` for each unit it is given."""

    def __init__(self, setup: Callable[[], Any] | None):
        import torch

        torch.set_num_threads(WORKER_THREADS)
        self.state, self.error = None, None
        try:
            self.state = setup() if setup is not None else None
        except GraftkitError as e:  # kept, to be raised by the first call: Ray reports a failed __init__ as a death
            self.error = e

    def call(self, fn: Callable[[Any], Any]) -> Any:
        if self.error is not None:
            raise self.error
        return fn(self.state)

    def run(self, work: Callable[[Any, Any], Any], item: Any) -> Any:
        if self.error is not None:
            raise self.error
        return work(self.state, item)


def _cause(e: BaseException) -> BaseException:
    """A worker's GraftkitError as itself (its one line), anything else as Ray reports it."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, GraftkitError) else e


class SerialPool:
    """The serial executor's one worker, this process: ``setup()`` once, here, then every unit in item order."""

    def __init__(self, setup: Callable[[], Any] | None):
        self.state = setup() if setup is not None else None

    def size(self, units: int) -> int:
        """How many workers ``units`` units get: one."""
        return 1

    def first(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(state)``."""
        return fn(self.state)

    def map(self, work: Callable[[Any, Any], Any], items: Sequence, on_start: Callable[[int], None] = lambda i: None,
            workers: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(index, work(state, items[index]))`` for every item in order; ``on_start(index)`` before each."""
        for i, item in enumerate(items):
            on_start(i)
            yield i, work(self.state, item)


@dataclass
class WorkerPool:
    """Ray actors on ``cluster`` (one CPU each, and one GPU with ``gpu``), each built once by ``setup`` when work
    first needs it: :meth:`first` starts one, :meth:`map` as many as it hands units to, fed as they free up."""

    cluster: Cluster
    setup: Callable[[], Any] | None = field(repr=False)
    gpu: bool
    workers: int | None
    """--workers (None: :func:`worker_count`'s default)."""
    ray: Any = field(repr=False)
    actors: list = field(default_factory=list)

    def size(self, units: int) -> int:
        """How many workers ``units`` units get (:func:`worker_count`)."""
        return worker_count(self.cluster, self.gpu, units, self.workers)

    def _started(self, n: int) -> list:
        """The first ``n`` actors, starting those not yet running."""
        remote = self.ray.remote(num_cpus=1, num_gpus=1 if self.gpu else 0, max_concurrency=1)(_Actor)
        while len(self.actors) < n:
            self.actors.append(remote.remote(self.setup))
        return self.actors[:n]

    def _get(self, ref) -> Any:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            raise _cause(e) from None

    def first(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(state)`` on the first worker."""
        (actor,) = self._started(1)
        return self._get(actor.call.remote(fn))

    def map(self, work: Callable[[Any, Any], Any], items: Sequence, on_start: Callable[[int], None] = lambda i: None,
            workers: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(index, work(state, items[index]))`` for every item, as each finishes, on ``workers`` workers (default
        :meth:`size` of the items); ``on_start(index)`` as each is handed to a worker (in item order)."""
        if not items:
            return
        ray, todo, running = self.ray, list(range(len(items)))[::-1], {}

        def give(actor) -> None:
            i = todo.pop()
            on_start(i)
            running[actor.run.remote(work, items[i])] = (i, actor)

        for actor in self._started(min(workers or self.size(len(items)), len(items))):
            give(actor)
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i, actor = running.pop(ref)
            result = self._get(ref)
            if todo:
                give(actor)
            yield i, result


_STATE: Any = None  # a local worker process's state, built once by its pool's setup


def _start_local_worker(setup: Callable[[], Any] | None) -> None:
    """A local worker process's first act: one torch thread, then its state."""
    global _STATE
    os.environ.update(OMP_NUM_THREADS=str(WORKER_THREADS), MKL_NUM_THREADS=str(WORKER_THREADS))
    import torch

    torch.set_num_threads(WORKER_THREADS)
    _STATE = setup() if setup is not None else None


def _local_call(fn: Callable[[Any], Any]) -> Any:
    return fn(_STATE)


def _local_run(work: Callable[[Any, Any], Any], item: Any) -> Any:
    return work(_STATE, item)


class ProcessPool:
    """Worker processes on this machine (``processes`` executor), each a fresh interpreter (spawned, never forked
    from this one, whose torch threads a fork would inherit mid-state), running torch on one thread, its state
    built once by ``setup``; fed one unit at a time as each frees up. What crosses to a worker is pickled:
    ``setup``, ``work`` and the items must be module-level functions, partials of them, or data (frozen configs,
    paths). A unit's result does not depend on which worker ran it, nor on how many there are."""

    def __init__(self, setup: Callable[[], Any] | None, workers: int):
        import concurrent.futures
        import multiprocessing

        self.workers = max(1, workers)
        self.executor = concurrent.futures.ProcessPoolExecutor(
            self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_local_worker,
            initargs=(setup,))

    def size(self, units: int) -> int:
        """How many workers ``units`` units get: the pool's, at most one per unit."""
        return max(1, min(self.workers, units))

    def first(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(state)`` on one worker."""
        return self.submit(fn).result()

    def submit(self, fn: Callable[[Any], Any]):
        """``fn(state)`` on the next worker free: a ``concurrent.futures.Future`` of its result."""
        return self.executor.submit(_local_call, fn)

    def map(self, work: Callable[[Any, Any], Any], items: Sequence, on_start: Callable[[int], None] = lambda i: None,
            workers: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(index, work(state, items[index]))`` for every item, as each finishes, at most ``workers`` (default
        :meth:`size`) at a time; ``on_start(index)`` as each is handed to a worker (in item order)."""
        import concurrent.futures

        todo, running = list(range(len(items)))[::-1], {}

        def give() -> None:
            i = todo.pop()
            on_start(i)
            running[self.executor.submit(_local_run, work, items[i])] = i

        for _ in range(min(workers or self.size(len(items)), len(items))):
            give()
        while running:
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                result = future.result()
                if todo:
                    give()
                yield i, result

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def cpu_workers() -> int:
    """One worker per CPU core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def worker_pool(cluster: Cluster, setup: Callable[[], Any] | None, gpu: bool = False, workers: int | None = None
                ) -> Iterator[WorkerPool]:
    """A :class:`WorkerPool` on ``cluster``; its actors are killed when the block ends, so a reused cluster gets
    its resources back. ``workers`` the cluster cannot place is an error here, before any actor is scheduled."""
    ray = ray_module()
    worker_count(cluster, gpu, 1, workers)
    pool = WorkerPool(cluster, setup, gpu, workers, ray)
    try:
        yield pool
    finally:
        for a in pool.actors:
            ray.kill(a)


@dataclass(frozen=True)
class Executor:
    """Where the units of a sweep run, picked once: ``serial`` (in this process, one after another) or ``ray``
    (on the workers of the cluster at ``address``: ``workers`` of them, or :func:`worker_count`'s default).
    ``device`` is the device the units' models run on (with Ray, it decides whether each worker takes a GPU).

    :meth:`pool` gives either kind's pool, with one interface: ``size(units)``, ``first(fn)`` (``fn(state)`` on
    one worker) and ``map(work, items)`` (``(index, work(state, item))`` as each finishes); each worker's
    ``state`` is built once by the ``setup`` it was given, in that worker's process (never in this one under
    Ray)."""

    kind: str = "serial"
    address: str = "local"
    workers: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GraftkitError(f"unknown --executor {self.kind!r}", f"use one of {', '.join(EXECUTORS)}")

    @classmethod
    def of(cls, cfg) -> "Executor":
        """The executor a command's config asks for (its ExecutorOption and DeviceOption fields)."""
        return cls(cfg.executor, cfg.ray_address, cfg.workers, getattr(cfg, "device", "cpu"))

    @property
    def local(self) -> bool:
        """Units run in this process: callbacks handed to them reach the caller (a worker's stay there)."""
        return self.kind == "serial"

    @property
    def unit_device(self) -> str:
        """The device a unit runs ``device`` on: itself in a process of this machine, :func:`worker_device` on a
        Ray worker."""
        return worker_device(self.device) if self.kind == "ray" else self.device

    @contextlib.contextmanager
    def pool(self, setup: Callable[[], Any] | None = None) -> Iterator[SerialPool | ProcessPool | WorkerPool]:
        """This executor's pool for the ``with`` block, each worker's state built by ``setup()``. A serial
        state with a ``close()`` method is closed when the block ends (a worker's goes with its process)."""
        if self.kind == "processes":
            pool = ProcessPool(setup, self.workers or cpu_workers())
            try:
                yield pool
            finally:
                pool.close()
            return
        if self.local:
            pool = SerialPool(setup)
            try:
                yield pool
            finally:
                close = getattr(pool.state, "close", None)
                if callable(close):
                    close()
            return
        with ray_cluster(self.address, self.workers) as cluster:
            with worker_pool(cluster, setup, wants_gpu(self.device, cluster), self.workers) as pool:
                yield pool

    def run(self, items: Sequence, work: Callable[[Any, Any], Any], *, setup: Callable[[], Any] | None = None,
            on_start: Callable[[int], None] = lambda i: None,
            on_result: Callable[[int, Any], None] = lambda i, r: None) -> list:
        """Every item through ``work(state, item)`` on this executor's pool; ``on_result(index, result)`` as each
        finishes. Returns the results in item order (nothing is started for no items)."""
        results: dict[int, Any] = {}
        if items:
            with self.pool(setup) as pool:
                for i, r in pool.map(work, items, on_start):
                    results[i] = r
                    on_result(i, r)
        return [results[i] for i in range(len(items))]
