"""``--executor ray``: graft sweeps, evaluations of many models and GRPO grids on Ray workers give exactly
what the serial executor gives; a killed sweep resumes without replaying finished work; a GPU request on
a CPU-only cluster is an error, not a hang; and the serial default never imports Ray.

One Ray session (2 CPUs) serves the whole module; the executor reuses it and leaves it running.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from graftkit.core.errors import GraftkitError

TASKS = "click-button,focus-text"


#: Tests that start worker processes (Ray here, the study's pool in test_study.py) share one xdist worker,
#: so two of them never compete for the machine's cores and time out.
pytestmark = pytest.mark.xdist_group("processes")


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from graftkit.core.executor import worker_env

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp = tempfile.mkdtemp(prefix="gk-ray-")  # short: Ray's socket paths must fit 107 bytes
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, _temp_dir=temp,
                 runtime_env={"env_vars": worker_env(), "worker_process_setup_hook": plant_rewards})
    yield ray
    if started:
        ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def plant_rewards() -> None:
    """GRPO rollouts end with planted rewards (1, 0, 1, 0, ... by sample), so a tiny untrained policy gets
    nonzero advantages and every step moves it (tests/test_training_effect.py plants the same); installed
    in this process by the GRPO test and in every Ray worker of the session as it starts."""
    from graftkit.train import grpo

    if getattr(grpo.rollout, "planted", False):
        return
    real = grpo.rollout

    def rollout(*args, **kwargs):
        episodes = real(*args, **kwargs)
        for ep in episodes:
            ep.done, ep.reward = True, float(ep.sample % 2 == 0)
        return episodes

    rollout.planted = True
    grpo.rollout = rollout


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A tiny SFT policy and an RL child moved in attention (planted)."""
    from conftest import planted_policies

    return planted_policies(tmp_path_factory.mktemp("policies"), children=(("rl", ".self_attn.", 1),))


def _data(path) -> dict[str, np.ndarray]:
    from graftkit.results.store import read_result

    res = read_result(path)
    return {k: np.asarray(res[k]) for k in res.data}


def _assert_same_data(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if a[k].dtype.kind == "f":
            assert a[k].tobytes() == b[k].tobytes(), k  # bit for bit (NaN where both are NaN)
        else:
            assert (a[k] == b[k]).all(), k


# ------------------------------------------------------------------------------------- the executor


def _pid():
    return os.getpid()


def _no_model():
    raise GraftkitError("no model here", "pass a model")


def _tagged(pid, x):
    if x == 3:
        raise GraftkitError(f"unit {x} is bad", "fix unit 3")
    return (pid, x * x, os.environ.get("HF_HUB_OFFLINE"))


@pytest.mark.slow
def test_pool_builds_each_worker_once_and_yields_every_unit(ray_session):
    from graftkit.core.executor import Executor

    started = []
    got = Executor("ray", workers=2).run([0, 1, 2, 4, 5, 6], _tagged, setup=_pid, on_start=started.append)
    assert [x for _, x, _ in got] == [0, 1, 4, 16, 25, 36] and sorted(started) == list(range(6))
    assert 1 <= len({pid for pid, _, _ in got}) <= 2 and os.getpid() not in {pid for pid, _, _ in got}
    assert {env for _, _, env in got} == {"1"}  # the driver's offline setting reaches the workers
    with pytest.raises(GraftkitError, match="unit 3 is bad") as e:  # a worker's error is itself, one line
        Executor("ray", workers=1).run([1, 3], _tagged, setup=_pid)
    assert type(e.value) is GraftkitError
    with pytest.raises(GraftkitError, match="no model here"):  # so is an error of a worker's setup
        Executor("ray", workers=1).run([1, 2], _tagged, setup=_no_model)
    with pytest.raises(GraftkitError, match=r"--workers 3 with one CPU each: .* has 2 CPU\(s\)"):
        Executor("ray", workers=3).run([1, 2, 4], _tagged)  # more workers than CPUs would wait for ever
    # the pool's actors were released: a task that needs both of the session's CPUs is scheduled (it would wait
    # for ever behind a leaked actor). Its worker process starts fresh (imports, setup hook): minutes on 2 loaded
    # cores, hence the long limit.
    assert ray_session.get(ray_session.remote(num_cpus=2)(_pid).remote(), timeout=300) > 0


class _Closing:
    def __init__(self):
        self.pid, self.closed = os.getpid(), False

    def close(self):
        self.closed = True


def test_serial_pool_builds_its_state_here_once_and_runs_units_in_order():
    from graftkit.core.executor import Executor

    built, started = [], []
    ex = Executor()
    assert ex.local and ex.unit_device == "cpu" and Executor(device="cuda:1").unit_device == "cuda:1"
    with ex.pool(lambda: built.append(_Closing()) or built[-1]) as pool:
        assert pool.size(10) == 1 and pool.first(lambda s: s.pid) == os.getpid()
        got = list(pool.map(lambda s, x: (s.pid, x * x), [0, 1, 2], started.append))
    assert got == [(0, (os.getpid(), 0)), (1, (os.getpid(), 1)), (2, (os.getpid(), 4))] and started == [0, 1, 2]
    assert len(built) == 1 and built[0].closed  # the state was built once, and closed with the pool
    assert Executor().run([1, 2, 4], _tagged, setup=_pid) == [(os.getpid(), x * x, os.environ.get("HF_HUB_OFFLINE"))
                                                             for x in (1, 2, 4)]
    assert Executor(device="cuda:1", kind="ray").unit_device == "cuda"
    with pytest.raises(GraftkitError, match="unknown --executor 'dask'"):
        Executor("dask")


@pytest.mark.slow
def test_gpu_request_on_a_cpu_cluster_is_an_error_not_a_hang(ray_session, policies):
    from graftkit.core.executor import Executor
    from graftkit.evaluation.commands import EvalConfig, run_eval

    t0 = time.perf_counter()
    with pytest.raises(GraftkitError, match=r"--device cuda:1 with --executor ray: the Ray cluster .* has no GPU"):
        Executor("ray", device="cuda:1").run([1], _tagged)
    with pytest.raises(GraftkitError, match="--device cuda .*--executor ray.*no GPU") as e:
        run_eval(EvalConfig(model=policies["sft"], tasks="click-button", seeds=1, episodes=1, device="cuda",
                            executor="ray"))
    assert "--device cpu" in str(e.value)
    assert time.perf_counter() - t0 < 30


def test_missing_ray_is_one_error_naming_the_extra(monkeypatch, policies):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(GraftkitError, match=r"--executor ray needs Ray — pip install 'graftkit\[ray\]'"):
        run_eval(EvalConfig(model=policies["sft"], tasks="click-button", seeds=1, episodes=1, executor="ray"))


def test_serial_default_needs_no_ray(monkeypatch, policies, tmp_path):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    code = ("import sys, graftkit, graftkit.cli, graftkit.core.executor, graftkit.train.commands, graftkit.graft.commands; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "ray", None)
    run = run_eval(EvalConfig(model=policies["sft"], tasks="click-button", seeds=1, episodes=1, run=tmp_path))
    assert run.results["model"].success.shape == (1, 1, 1, 1)


# ------------------------------------------------------------------------------------------ graft sweep


@pytest.mark.slow
def test_graft_sweep_on_ray_is_the_serial_sweep_and_resumes_a_killed_one(ray_session, policies, tmp_path):
    from graftkit.graft.commands import GraftConfig, run_graft

    common = dict(rl=policies["rl"], sweep="factorial", groups="attn,mlp,norm", tasks=TASKS, seeds=2, episodes=1,
                  max_new_tokens=4)
    serial = run_graft(GraftConfig(run=tmp_path / "serial", **common))
    configs = list(serial.sweeps["A"].configs)
    assert len(configs) == 2 ** 3 + 1  # ∅ is the base; the RL model (every group) is extra

    class Killed(Exception):
        pass

    def kill_at_third(what, advance, total, unit):
        if what.endswith(f": {configs[2]}"):
            raise Killed

    with pytest.raises(Killed):
        run_graft(GraftConfig(run=tmp_path / "ray", **common), kill_at_third)
    played = []
    ray = run_graft(GraftConfig(run=tmp_path / "ray", executor="ray", workers=2, **common),
                    lambda what, advance, total, unit: played.append(what))
    assert ray.resumed["A"] == sorted(configs[:2])
    assert sorted(played) == sorted(f"rl: {c}" for c in configs[2:])  # only the missing ones, each once
    _assert_same_data(_data(ray.files["A"]), _data(serial.files["A"]))
    assert ray.sweeps["A"].attrs["complete"] and not list((tmp_path / "ray" / "results").glob(".partial-*"))


@pytest.mark.slow
def test_graft_sweep_on_ray_opens_the_pair_in_the_workers_only(ray_session, policies, tmp_path, monkeypatch):
    """Under Ray each worker's setup opens and casts the pair once; this process opens no checkpoint (it
    plans, writes and resumes from what the workers return), and a sweep whose configurations are split into
    seed blocks over two workers gives the serial outcomes bit for bit."""
    from graftkit.graft.commands import GraftConfig, run_graft
    from graftkit.weights.checkpoint import Checkpoint

    opened: list[str] = []
    real = Checkpoint.__init__

    def counted(self, *args, **kwargs):
        opened.append(str(kwargs.get("path", args[0] if args else "")))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Checkpoint, "__init__", counted)
    common = dict(rl=policies["rl"], sweep="single", groups="attn,mlp", tasks=TASKS, seeds=3, episodes=1,
                  max_new_tokens=4)
    serial = run_graft(GraftConfig(run=tmp_path / "serial", **common))
    assert opened  # the serial executor's one worker is this process: the counter sees its opens
    opened.clear()
    ray = run_graft(GraftConfig(run=tmp_path / "ray", executor="ray", workers=2, **common))
    assert opened == []
    assert ray.sweeps["A"].configs == serial.sweeps["A"].configs and ray.notes == serial.notes
    _assert_same_data(_data(ray.files["A"]), _data(serial.files["A"]))
    a, b = ray.sweeps["A"].attrs, serial.sweeps["A"].attrs
    assert (a["base"], a["rl"], a["placement"]) == (b["base"], b["rl"], b["placement"])


# ----------------------------------------------------------------------------------------------- eval


@pytest.mark.slow
def test_eval_of_two_models_on_ray_is_the_serial_eval(ray_session, policies, tmp_path):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    common = dict(model=(policies["sft"], policies["rl"]), compare_to=policies["sft"], tasks=TASKS, seeds=2,
                  episodes=2)
    serial = run_eval(EvalConfig(run=tmp_path / "serial", **common))
    ray = run_eval(EvalConfig(run=tmp_path / "ray", executor="ray", **common))
    assert serial.models == ray.models == ("model", "model-2")
    assert set(ray.files) == {"model", "model-2", "compare"}
    for role in ray.files:
        _assert_same_data(_data(ray.files[role]), _data(serial.files[role]))
    assert ray.tables == serial.tables and ray.rows == serial.tables["model"]
    assert ray.tables["model"][-1]["diff"] == 0  # sft against itself, on identical episodes
    assert ray.results["model-2"].model_path == str(policies["rl"])


def test_eval_expands_a_trainer_output_dir_with_all_checkpoints(policies, tmp_path):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    out = tmp_path / "trainer"
    for step in (2, 10):
        shutil.copytree(policies["sft"], out / f"checkpoint-{step}")
    run = run_eval(EvalConfig(model=out, all_checkpoints=True, tasks="click-button", seeds=1, episodes=1,
                              run=tmp_path / "run"))
    assert run.models == ("model", "model-2")
    assert [Path(run.results[r].model_path).name for r in run.models] == ["checkpoint-2", "checkpoint-10"]
    assert [p.name for p in run.files.values()] == ["eval-trainer-checkpoint-2-greedy.h5",
                                                    "eval-trainer-checkpoint-10-greedy.h5"]
    last = run_eval(EvalConfig(model=out, tasks="click-button", seeds=1, episodes=1, run=tmp_path / "run"))
    assert last.models == ("model",) and Path(last.results["model"].model_path).name == "checkpoint-10"
    with pytest.raises(GraftkitError, match="--save names one result file"):
        run_eval(EvalConfig(model=out, all_checkpoints=True, save=tmp_path / "x.h5", seeds=1, episodes=1))


# ----------------------------------------------------------------------------------------------- GRPO


@pytest.mark.slow
def test_grpo_grid_on_ray_writes_the_serial_policies_byte_for_byte(ray_session, policies, tmp_path, monkeypatch):
    from graftkit.train import grpo
    from graftkit.train.configs import SweepConfig
    from graftkit.train.commands import run_sweep_grid

    monkeypatch.setattr(grpo, "rollout", grpo.rollout)  # restored after the test
    plant_rewards()

    def grid(name: str) -> Path:
        g = tmp_path / f"{name}.yaml"
        g.write_text(f"out: {name}\ninits:\n  sft: {policies['sft']}\n"
                     "base: {init: sft, steps: 2, tasks: click-button, prompts_per_step: 1, group_size: 4, "
                     "max_new_tokens: 6, max_turns: 1}\nruns:\n  - {name: a}\n  - {name: b, seed: 1}\n")
        return g

    serial = run_sweep_grid(SweepConfig(grid=grid("serial"), device="cpu"))
    seen = []
    ray = run_sweep_grid(SweepConfig(grid=grid("ray"), device="cpu", executor="ray"),
                         on_run=lambda name, status: seen.append((name, status)))
    assert sorted(seen) == [("a", "new"), ("b", "new")]
    assert [r["status"] for r in ray["runs"]] == [r["status"] for r in serial["runs"]] == ["new", "new"]
    for name in ("a", "b"):
        a, b = tmp_path / "serial" / name, tmp_path / "ray" / name
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), name
        assert json.loads((b / "graftkit.json").read_text())["step"] == 2
    init = (policies["sft"] / "model.safetensors").read_bytes()
    trained = [(tmp_path / "serial" / n / "model.safetensors").read_bytes() for n in ("a", "b")]
    assert init not in trained and trained[0] != trained[1]  # the runs moved the policy, each its own way
    seen.clear()
    again = run_sweep_grid(SweepConfig(grid=grid("ray"), device="cpu", executor="ray"),
                           on_run=lambda name, status: seen.append((name, status)))
    assert seen == [("a", "done"), ("b", "done")] and [r["status"] for r in again["runs"]] == ["done", "done"]
