"""Executors of sweeps: many independent units, run one after another here or on Ray workers.

Graft sweeps, evaluations of many checkpoints and GRPO grids are lists of frozen, serialisable specs.
``--executor serial`` (the default) runs them in this process and never imports Ray. ``--executor ray``
hands them to a :class:`WorkerPool`: one long-lived Ray actor per worker, each built once by a ``setup``
callable (e.g. the loaded base policy of a graft sweep), then fed one unit at a time as it frees up. The
driver receives ``(index, result)`` as each unit finishes, so it can write partial results exactly as the
serial path does. This module runs callables and knows nothing of what they compute (a leaf: Ray and
torch are imported lazily).

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

from .errors import GraftkitError

#: Environment variables (exact names, or prefixes ending in ``_``) each Ray worker inherits from the driver.
FORWARDED_ENV = ("HF_", "TRANSFORMERS_", "TOKENIZERS_PARALLELISM", "GRAFTKIT_", "SE_OFFLINE", "MINIWOB_")
#: Threads each worker's torch uses: the workers share the machine's cores.
WORKER_THREADS = 1


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


@dataclass
class WorkerPool:
    """Ray actors, each built once by ``setup``; :meth:`map` feeds them units as they free up."""

    actors: list
    ray: Any = field(repr=False)

    def broadcast(self, fn: Callable[[Any], Any]) -> list:
        """``fn(state)`` on every worker (e.g. where its model runs), in worker order."""
        try:
            return self.ray.get([a.call.remote(fn) for a in self.actors])
        except self.ray.exceptions.RayTaskError as e:
            raise _cause(e) from None

    def map(self, work: Callable[[Any, Any], Any], items: Sequence,
            on_start: Callable[[int], None] = lambda i: None) -> Iterator[tuple[int, Any]]:
        """``(index, work(state, items[index]))`` for every item, as each finishes; ``on_start(index)`` as
        each is handed to a worker (in item order)."""
        ray, todo, running = self.ray, list(range(len(items)))[::-1], {}

        def give(actor) -> None:
            i = todo.pop()
            on_start(i)
            running[actor.run.remote(work, items[i])] = (i, actor)

        for actor in self.actors[:len(items)]:
            give(actor)
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i, actor = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                raise _cause(e) from None
            if todo:
                give(actor)
            yield i, result


@contextlib.contextmanager
def worker_pool(cluster: Cluster, setup: Callable[[], Any] | None, workers: int, gpu: bool = False
                ) -> Iterator[WorkerPool]:
    """``workers`` actors on ``cluster`` (one CPU each, and one GPU with ``gpu``), each running ``setup()``
    once; killed when the block ends, so a reused cluster gets its resources back."""
    ray = ray_module()
    remote = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0, max_concurrency=1)(_Actor)
    actors = [remote.remote(setup) for _ in range(workers)]
    try:
        yield WorkerPool(actors, ray)
    finally:
        for a in actors:
            ray.kill(a)


@contextlib.contextmanager
def ray_pool(setup: Callable[[], Any] | None, units: int, *, address: str = "local", workers: int | None = None,
             device: str = "cpu") -> Iterator[WorkerPool]:
    """A :func:`worker_pool` on the cluster at ``address``: the workers :func:`worker_count` gives for
    ``units`` units, a GPU each where ``device`` asks for one (:func:`wants_gpu`), each built by ``setup``."""
    with ray_cluster(address, workers) as cluster:
        gpu = wants_gpu(device, cluster)
        with worker_pool(cluster, setup, worker_count(cluster, gpu, units, workers), gpu) as pool:
            yield pool


def run_units(items: Sequence, work: Callable[[Any, Any], Any], *, setup: Callable[[], Any] | None = None,
              address: str = "local", workers: int | None = None, device: str = "cpu",
              on_start: Callable[[int], None] = lambda i: None,
              on_result: Callable[[int, Any], None] = lambda i, r: None) -> list:
    """Every item through ``work(state, item)`` on the workers of a :func:`ray_pool` (``state = setup()``
    once per worker, or None); ``on_result(index, result)`` as each finishes. Returns the results in item
    order."""
    results: dict[int, Any] = {}
    if items:
        with ray_pool(setup, len(items), address=address, workers=workers, device=device) as pool:
            for i, r in pool.map(work, items, on_start):
                results[i] = r
                on_result(i, r)
    return [results[i] for i in range(len(items))]
