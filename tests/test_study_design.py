"""The study's design as data (:mod:`graftkit.study.design`): every preset gives the configuration it gave before
the design moved out of the pipeline, value for value, in the same order and types, with the same grid of runs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest

from graftkit.study.pipeline import StudyConfig, grid

#: ``StudyConfig.preset("runs/demo", **kwargs)`` of each preset.
PRESETS = {"embedded-full": {}, "embedded-quick": {"quick": True}, "arithmetic-full": {"domain": "arithmetic"},
           "arithmetic-quick": {"domain": "arithmetic", "quick": True}, "smollm2-full": {"policy": "smollm2"},
           "smollm2-quick": {"policy": "smollm2", "quick": True}}

#: Each preset's config (``dataclasses.asdict`` through JSON, keys sorted), captured before the move.
GOLDEN = {'arithmetic-full': {'degrade_seeds': [0, 1, 2, 3, 4, 5],
                     'device': 'auto',
                     'domain': 'arithmetic',
                     'dtype': 'auto',
                     'eval_episodes': 2,
                     'eval_seeds': 25,
                     'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                     'graft_seeds': 25,
                     'grpo_checkpoints': True,
                     'grpo_group': 8,
                     'grpo_max_tokens': 12,
                     'grpo_prompts': 4,
                     'grpo_steps': 40,
                     'grpo_temperature': 1.5,
                     'headroom_k': 8,
                     'headroom_lr': 0.002,
                     'headroom_seeds': [0, 1, 2],
                     'headroom_tasks': None,
                     'mastered_tasks': None,
                     'out': 'runs/demo',
                     'policy': 'embedded',
                     'probe_tasks': 'multiples,arithmetic-2',
                     'probes': 64,
                     'quick': False,
                     'rank_layers': 'late',
                     'rank_weight_layers': 'all',
                     'regime_calibration': 'GRPO runs of a micro SFT policy (1500 steps on both suites; seed 0, 40 '
                                           'steps, T 1.5) on multiples, evaluated on training items (eval --items '
                                           'train): lr 1e-4 -> -2 points (98% -> 96%), 2e-3 -> -22, 1e-2 -> -98 '
                                           '(no answer format left)',
                     'regimes': {'collapse': 0.01, 'degrade': 0.002, 'null': 0.0001},
                     'seeds': [0, 1, 2],
                     'sft': None,
                     'sft_b_lr': None,
                     'sft_b_steps': 300,
                     'sft_batch_size': 32,
                     'sft_budgets': [],
                     'sft_lora_r': 0,
                     'sft_lr': 0.003,
                     'sft_steps': 1500,
                     'sft_tasks': 'multiples,arithmetic-2',
                     'sft_warmup': 100,
                     'suites': {'headroom': ['arithmetic-2'], 'mastered': ['multiples']},
                     'swept_seeds': 3,
                     'threads': 1,
                     'train_sft': True,
                     'variants': ['kl0.04', 'kl0.2', 'init-b-null', 'init-b-degrade', 'clip0.1', 'clip-high0.3']},
 'arithmetic-quick': {'degrade_seeds': [0, 1],
                      'device': 'auto',
                      'domain': 'arithmetic',
                      'dtype': 'auto',
                      'eval_episodes': 2,
                      'eval_seeds': 10,
                      'graft_groups': ['embed', 'attn', 'mlp', 'lm_head'],
                      'graft_seeds': 6,
                      'grpo_checkpoints': True,
                      'grpo_group': 8,
                      'grpo_max_tokens': 12,
                      'grpo_prompts': 4,
                      'grpo_steps': 12,
                      'grpo_temperature': 1.5,
                      'headroom_k': 4,
                      'headroom_lr': 0.002,
                      'headroom_seeds': [0],
                      'headroom_tasks': None,
                      'mastered_tasks': None,
                      'out': 'runs/demo',
                      'policy': 'embedded',
                      'probe_tasks': 'multiples,arithmetic-2',
                      'probes': 16,
                      'quick': True,
                      'rank_layers': 'late',
                      'rank_weight_layers': 'all',
                      'regime_calibration': 'GRPO runs of a micro SFT policy (1500 steps on both suites; seed 0, '
                                            '40 steps, T 1.5) on multiples, evaluated on training items (eval '
                                            '--items train): lr 1e-4 -> -2 points (98% -> 96%), 2e-3 -> -22, 1e-2 '
                                            '-> -98 (no answer format left)',
                      'regimes': {'collapse': 0.01, 'degrade': 0.002, 'null': 0.0001},
                      'seeds': [0, 1],
                      'sft': None,
                      'sft_b_lr': None,
                      'sft_b_steps': 40,
                      'sft_batch_size': 32,
                      'sft_budgets': [],
                      'sft_lora_r': 0,
                      'sft_lr': 0.003,
                      'sft_steps': 600,
                      'sft_tasks': 'multiples,arithmetic-2',
                      'sft_warmup': 100,
                      'suites': {'headroom': ['arithmetic-2'], 'mastered': ['multiples']},
                      'swept_seeds': 1,
                      'threads': 1,
                      'train_sft': True,
                      'variants': ['init-b-degrade']},
 'embedded-full': {'degrade_seeds': [0, 1, 2, 3, 4, 5],
                   'device': 'auto',
                   'domain': 'web',
                   'dtype': 'auto',
                   'eval_episodes': 2,
                   'eval_seeds': 25,
                   'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                   'graft_seeds': 25,
                   'grpo_checkpoints': True,
                   'grpo_group': 8,
                   'grpo_max_tokens': 32,
                   'grpo_prompts': 4,
                   'grpo_steps': 40,
                   'grpo_temperature': 1.5,
                   'headroom_k': 8,
                   'headroom_lr': 0.002,
                   'headroom_seeds': [0, 1, 2],
                   'headroom_tasks': None,
                   'mastered_tasks': None,
                   'out': 'runs/demo',
                   'policy': 'embedded',
                   'probe_tasks': 'all',
                   'probes': 64,
                   'quick': False,
                   'rank_layers': 'late',
                   'rank_weight_layers': 'all',
                   'regime_calibration': 'GRPO runs of the embedded SFT policy (seed 0, 40 steps, T 1.5) evaluated '
                                         'on training items (eval --items train): lr 1e-4 -> +0 points, 2e-3 -> '
                                         '-18, 5e-3 -> -50, 1e-2 -> -100',
                   'regimes': {'collapse': 0.01, 'degrade': 0.002, 'null': 0.0001},
                   'seeds': [0, 1, 2],
                   'sft': None,
                   'sft_b_lr': None,
                   'sft_b_steps': 300,
                   'sft_batch_size': 32,
                   'sft_budgets': [],
                   'sft_lora_r': 0,
                   'sft_lr': 0.003,
                   'sft_steps': 6000,
                   'sft_tasks': None,
                   'sft_warmup': 100,
                   'suites': {'headroom': ['click-button', 'click-link'], 'mastered': ['click-tab']},
                   'swept_seeds': 3,
                   'threads': 1,
                   'train_sft': False,
                   'variants': ['kl0.04', 'kl0.2', 'init-b-null', 'init-b-degrade', 'clip0.1', 'clip-high0.3']},
 'embedded-quick': {'degrade_seeds': [0, 1],
                    'device': 'auto',
                    'domain': 'web',
                    'dtype': 'auto',
                    'eval_episodes': 1,
                    'eval_seeds': 6,
                    'graft_groups': ['embed', 'attn', 'mlp', 'lm_head'],
                    'graft_seeds': 6,
                    'grpo_checkpoints': True,
                    'grpo_group': 8,
                    'grpo_max_tokens': 32,
                    'grpo_prompts': 4,
                    'grpo_steps': 12,
                    'grpo_temperature': 1.5,
                    'headroom_k': 4,
                    'headroom_lr': 0.002,
                    'headroom_seeds': [0],
                    'headroom_tasks': None,
                    'mastered_tasks': None,
                    'out': 'runs/demo',
                    'policy': 'embedded',
                    'probe_tasks': 'all',
                    'probes': 16,
                    'quick': True,
                    'rank_layers': 'late',
                    'rank_weight_layers': 'all',
                    'regime_calibration': 'GRPO runs of the embedded SFT policy (seed 0, 40 steps, T 1.5) '
                                          'evaluated on training items (eval --items train): lr 1e-4 -> +0 points, '
                                          '2e-3 -> -18, 5e-3 -> -50, 1e-2 -> -100',
                    'regimes': {'collapse': 0.01, 'degrade': 0.002, 'null': 0.0001},
                    'seeds': [0, 1],
                    'sft': None,
                    'sft_b_lr': None,
                    'sft_b_steps': 40,
                    'sft_batch_size': 32,
                    'sft_budgets': [],
                    'sft_lora_r': 0,
                    'sft_lr': 0.003,
                    'sft_steps': 600,
                    'sft_tasks': None,
                    'sft_warmup': 100,
                    'suites': {'headroom': ['click-button', 'click-link'], 'mastered': ['click-tab']},
                    'swept_seeds': 1,
                    'threads': 1,
                    'train_sft': False,
                    'variants': ['init-b-degrade']},
 'smollm2-full': {'degrade_seeds': [0, 1, 2],
                  'device': 'auto',
                  'domain': 'web',
                  'dtype': 'auto',
                  'eval_episodes': 2,
                  'eval_seeds': 25,
                  'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                  'graft_seeds': 12,
                  'grpo_checkpoints': True,
                  'grpo_group': 8,
                  'grpo_max_tokens': 32,
                  'grpo_prompts': 4,
                  'grpo_steps': 20,
                  'grpo_temperature': 1.5,
                  'headroom_k': 8,
                  'headroom_lr': 2e-05,
                  'headroom_seeds': [0, 1],
                  'headroom_tasks': None,
                  'mastered_tasks': None,
                  'out': 'runs/demo',
                  'policy': 'smollm2',
                  'probe_tasks': 'all',
                  'probes': 64,
                  'quick': False,
                  'rank_layers': 'late',
                  'rank_weight_layers': 'all',
                  'regime_calibration': 'chosen for full fine-tuning of a 135M model with AdamW before any run of '
                                        'this study (null: an update below bf16 resolution of most weights; '
                                        'collapse: 200x null per step), not tuned on its evaluation',
                  'regimes': {'collapse': 0.0002, 'degrade': 2e-05, 'null': 1e-06},
                  'seeds': [0, 1, 2],
                  'sft': None,
                  'sft_b_lr': 0.0001,
                  'sft_b_steps': 60,
                  'sft_batch_size': 8,
                  'sft_budgets': ['click-button=2000', 'click-link=2000', 'click-tab=1000', 'enter-text=400',
                                  'click-tab-2=300'],
                  'sft_lora_r': 16,
                  'sft_lr': 0.001,
                  'sft_steps': 480,
                  'sft_tasks': 'click-tab,click-button,click-link,enter-text,click-tab-2',
                  'sft_warmup': 48,
                  'suites': {'headroom': ['click-tab-2'],
                             'mastered': ['click-tab', 'click-button', 'click-link', 'enter-text']},
                  'swept_seeds': 2,
                  'threads': 2,
                  'train_sft': True,
                  'variants': ['init-b-degrade', 'kl0.04']},
 'smollm2-quick': {'degrade_seeds': [0],
                   'device': 'auto',
                   'domain': 'web',
                   'dtype': 'auto',
                   'eval_episodes': 1,
                   'eval_seeds': 12,
                   'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                   'graft_seeds': 4,
                   'grpo_checkpoints': False,
                   'grpo_group': 4,
                   'grpo_max_tokens': 32,
                   'grpo_prompts': 2,
                   'grpo_steps': 6,
                   'grpo_temperature': 1.5,
                   'headroom_k': 4,
                   'headroom_lr': 2e-05,
                   'headroom_seeds': [0],
                   'headroom_tasks': None,
                   'mastered_tasks': None,
                   'out': 'runs/demo',
                   'policy': 'smollm2',
                   'probe_tasks': 'all',
                   'probes': 16,
                   'quick': True,
                   'rank_layers': 'late',
                   'rank_weight_layers': 'all',
                   'regime_calibration': 'chosen for full fine-tuning of a 135M model with AdamW before any run of '
                                         'this study (null: an update below bf16 resolution of most weights; '
                                         'collapse: 200x null per step), not tuned on its evaluation',
                   'regimes': {'collapse': 0.0002, 'degrade': 2e-05, 'null': 1e-06},
                   'seeds': [0],
                   'sft': None,
                   'sft_b_lr': 0.0001,
                   'sft_b_steps': 20,
                   'sft_batch_size': 4,
                   'sft_budgets': ['click-button=2000', 'click-link=2000', 'click-tab=1000', 'enter-text=400',
                                   'click-tab-2=300'],
                   'sft_lora_r': 16,
                   'sft_lr': 0.001,
                   'sft_steps': 420,
                   'sft_tasks': 'click-tab,click-button,click-link,enter-text,click-tab-2',
                   'sft_warmup': 20,
                   'suites': {'headroom': ['click-tab-2'],
                              'mastered': ['click-tab', 'click-button', 'click-link', 'enter-text']},
                   'swept_seeds': 1,
                   'threads': 2,
                   'train_sft': True,
                   'variants': []}}

#: sha256 of ``repr((asdict(cfg), grid(cfg)))``: what JSON does not keep (tuples, the order of the regimes and the
#: suites) and the runs of the grid, captured before the move.
GOLDEN_REPR = {'arithmetic-full': 'dec9c87d2a59d41288b358f41553d611667cd5b36eb0f304a8b5d4fc1c4d4e69',
 'arithmetic-quick': '9e3765c167aff0f1347212b4e182bec3d94f8b77a016e9f028d0c86dba336668',
 'embedded-full': 'a61a631f0eb168502592704495635f76da47d00ab6b7c4eef5d6f15750571eac',
 'embedded-quick': 'a51768dc267039573ab33064c66ae2b7c361e7c5f0196c394f15a1e05b34e905',
 'smollm2-full': 'bb783d7bfb80ff9b24dfe9209f5356d07f6037ab022f403e3e06f41252e6bcf2',
 'smollm2-quick': 'a85f7fcb924ac32dd873a176048d6ca8183bbd1b6f8b99759406dfad0015c523'}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_gives_the_same_config_as_before(name):
    cfg = StudyConfig.preset("runs/demo", **PRESETS[name])
    assert json.loads(json.dumps(asdict(cfg), sort_keys=True)) == GOLDEN[name]
    assert hashlib.sha256(repr((asdict(cfg), grid(cfg))).encode()).hexdigest() == GOLDEN_REPR[name]


def test_suites_are_one_table_of_known_disjoint_web_tasks():
    from graftkit.study.design import SUITES
    from graftkit.webenv.tasks import TASKS

    assert set(SUITES) == {"mastered", "headroom"}
    mastered, headroom = set(SUITES["mastered"]), set(SUITES["headroom"])
    assert not mastered & headroom and (mastered | headroom) <= set(TASKS)
    assert StudyConfig.preset("runs/demo").suites == SUITES


def test_every_tasks_option_reads_the_study_suites(monkeypatch):
    """``--tasks mastered`` resolves through core.suites, which holds the study's table itself: a suite
    changed there is the suite every command plays."""
    from graftkit.agent import resolve_tasks
    from graftkit.agent.tasks import HINT
    from graftkit.core.errors import GraftkitError
    from graftkit.core.suites import suites
    from graftkit.study.design import SUITES
    from graftkit.train.sweep import _tasks

    assert suites() is SUITES and "suites: mastered, headroom, all" in HINT
    assert resolve_tasks("headroom, click-tab") == [*SUITES["headroom"], "click-tab"]
    monkeypatch.setitem(SUITES, "mastered", ("enter-text", "focus-text"))
    assert resolve_tasks("mastered") == ["enter-text", "focus-text"] == list(_tasks("mastered"))
    with pytest.raises(GraftkitError, match="unknown task or suite 'nope'"):
        resolve_tasks("click-tab,nope")
