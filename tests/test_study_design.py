"""The study's design as data (:mod:`graftkit.study.design`): every preset gives the configuration the design sets,
value for value, in the same order and types, with the same grid of runs."""

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

#: Each preset's config (``dataclasses.asdict`` through JSON, keys sorted), as the design last set it: a change to
#: a preset, meant or not, shows here first.
GOLDEN = {'arithmetic-full': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                     'control_seeds': [0, 1, 2, 3],
                     'degrade_seeds': [0, 1, 2, 3, 4, 5],
                     'device': 'auto',
                     'domain': 'arithmetic',
                     'engine': 'hf',
                     'dtype': 'auto',
                     'eval_episodes': 2,
                     'eval_seeds': 25,
                     'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                     'graft_metric': 'both',
                     'graft_seeds': 25,
                     'grpo_checkpoints': True,
                     'grpo_group': 8,
                     'grpo_max_tokens': 12,
                     'grpo_prompts': 4,
                     'grpo_steps': 40,
                     'grpo_temperature': 1.5,
                     'headroom_calibration': "the degrade regime's rate and temperature",
                     'headroom_k': 8,
                     'headroom_lr': 0.002,
                     'headroom_seeds': [0, 1, 2],
                     'headroom_tasks': None,
                     'headroom_temperature': 1.5,
                     'kl_seeds': 12,
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
 'arithmetic-quick': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                      'control_seeds': [0, 1, 2, 3],
                      'degrade_seeds': [0, 1],
                      'device': 'auto',
                      'domain': 'arithmetic',
                      'engine': 'hf',
                      'dtype': 'auto',
                      'eval_episodes': 2,
                      'eval_seeds': 10,
                      'graft_groups': ['embed', 'attn', 'mlp', 'lm_head'],
                      'graft_metric': 'both',
                      'graft_seeds': 6,
                      'grpo_checkpoints': True,
                      'grpo_group': 8,
                      'grpo_max_tokens': 12,
                      'grpo_prompts': 4,
                      'grpo_steps': 12,
                      'grpo_temperature': 1.5,
                      'headroom_calibration': "the degrade regime's rate and temperature",
                      'headroom_k': 4,
                      'headroom_lr': 0.002,
                      'headroom_seeds': [0],
                      'headroom_tasks': None,
                      'headroom_temperature': 1.5,
                      'kl_seeds': 12,
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
 'embedded-full': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                   'control_seeds': [0, 1, 2, 3],
                   'degrade_seeds': [0, 1, 2, 3, 4, 5],
                   'device': 'auto',
                   'domain': 'web',
                   'engine': 'hf',
                   'dtype': 'auto',
                   'eval_episodes': 4,
                   'eval_seeds': 25,
                   'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                   'graft_metric': 'both',
                   'graft_seeds': 25,
                   'grpo_checkpoints': True,
                   'grpo_group': 8,
                   'grpo_max_tokens': 32,
                   'grpo_prompts': 4,
                   'grpo_steps': 40,
                   'grpo_temperature': 1.5,
                   'headroom_calibration': 'GRPO from the control SFT policy on click-tab (4 prompts x 8, T 1.0), '
                                           'greedy success on 50 training items (eval --items train; the control '
                                           'SFT 18%), seeds 0/1/2: lr 1e-4, 40 steps -> 98%, 96%, 96%; 3e-4, 20 '
                                           'steps -> 94%, 0% (action format lost), 98%; 3e-4, 40 steps -> seed 1 '
                                           'loses the format too',
                   'headroom_k': 8,
                   'headroom_lr': 0.0001,
                   'headroom_seeds': [0, 1, 2],
                   'headroom_tasks': None,
                   'headroom_temperature': 1.0,
                   'kl_seeds': 12,
                   'mastered_tasks': None,
                   'out': 'runs/demo',
                   'policy': 'embedded',
                   'probe_tasks': 'all',
                   'probes': 64,
                   'quick': False,
                   'rank_layers': 'late',
                   'rank_weight_layers': 'all',
                   'regime_calibration': "GRPO runs of the study's SFT policy (seed 0, 40 steps, T 1.5) on the "
                                         'mastered suite, evaluated on training items (eval --items train, 25 '
                                         'seeds x 2): lr 1e-4 -> -2 points (94% -> 92%), 2e-3 -> -12 (82%), 1e-2 '
                                         '-> -94 (0%: no action format left)',
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
                   'suites': {'control': ['click-tab'], 'headroom': ['click-button'], 'mastered': ['click-tab']},
                   'swept_seeds': 3,
                   'threads': 1,
                   'train_sft': False,
                   'variants': ['kl0.04', 'kl0.2', 'init-b-null', 'init-b-degrade', 'clip0.1', 'clip-high0.3']},
 'embedded-quick': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                    'control_seeds': [0],
                    'degrade_seeds': [0, 1],
                    'device': 'auto',
                    'domain': 'web',
                    'engine': 'hf',
                    'dtype': 'auto',
                    'eval_episodes': 1,
                    'eval_seeds': 6,
                    'graft_groups': ['embed', 'attn', 'mlp', 'lm_head'],
                    'graft_metric': 'both',
                    'graft_seeds': 6,
                    'grpo_checkpoints': True,
                    'grpo_group': 8,
                    'grpo_max_tokens': 32,
                    'grpo_prompts': 4,
                    'grpo_steps': 8,
                    'grpo_temperature': 1.5,
                    'headroom_calibration': 'GRPO from the control SFT policy on click-tab (4 prompts x 8, T 1.0), '
                                            'greedy success on 50 training items (eval --items train; the control '
                                            'SFT 18%), seeds 0/1/2: lr 1e-4, 40 steps -> 98%, 96%, 96%; 3e-4, 20 '
                                            'steps -> 94%, 0% (action format lost), 98%; 3e-4, 40 steps -> seed 1 '
                                            'loses the format too',
                    'headroom_k': 4,
                    'headroom_lr': 0.0001,
                    'headroom_seeds': [0],
                    'headroom_tasks': None,
                    'headroom_temperature': 1.0,
                    'kl_seeds': 4,
                    'mastered_tasks': None,
                    'out': 'runs/demo',
                    'policy': 'embedded',
                    'probe_tasks': 'all',
                    'probes': 16,
                    'quick': True,
                    'rank_layers': 'late',
                    'rank_weight_layers': 'all',
                    'regime_calibration': "GRPO runs of the study's SFT policy (seed 0, 40 steps, T 1.5) on the "
                                          'mastered suite, evaluated on training items (eval --items train, 25 '
                                          'seeds x 2): lr 1e-4 -> -2 points (94% -> 92%), 2e-3 -> -12 (82%), 1e-2 '
                                          '-> -94 (0%: no action format left)',
                    'regimes': {'collapse': 0.01, 'degrade': 0.002, 'null': 0.0001},
                    'seeds': [0, 1],
                    'sft': None,
                    'sft_b_lr': None,
                    'sft_b_steps': 20,
                    'sft_batch_size': 32,
                    'sft_budgets': [],
                    'sft_lora_r': 0,
                    'sft_lr': 0.003,
                    'sft_steps': 600,
                    'sft_tasks': None,
                    'sft_warmup': 100,
                    'suites': {'control': ['click-tab'], 'headroom': ['click-button'], 'mastered': ['click-tab']},
                    'swept_seeds': 1,
                    'threads': 1,
                    'train_sft': False,
                    'variants': ['init-b-degrade']},
 'smollm2-full': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                  'control_seeds': [0, 1, 2, 3],
                  'degrade_seeds': [0, 1, 2],
                  'device': 'auto',
                  'domain': 'web',
                  'engine': 'hf',
                  'dtype': 'auto',
                  'eval_episodes': 2,
                  'eval_seeds': 25,
                  'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                  'graft_metric': 'both',
                  'graft_seeds': 12,
                  'grpo_checkpoints': True,
                  'grpo_group': 8,
                  'grpo_max_tokens': 32,
                  'grpo_prompts': 4,
                  'grpo_steps': 20,
                  'grpo_temperature': 1.5,
                  'headroom_calibration': "the degrade regime's rate and temperature",
                  'headroom_k': 8,
                  'headroom_lr': 2e-05,
                  'headroom_seeds': [0, 1],
                  'headroom_tasks': None,
                  'headroom_temperature': 1.5,
                  'kl_seeds': 12,
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
                  'sft_budgets': ['click-button=2000',
                                  'click-link=2000',
                                  'click-tab=1000',
                                  'enter-text=400',
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
 'smollm2-quick': {'control': {'decoy': 0.6, 'lr': 0.001, 'steps': 60},
                   'control_seeds': [0, 1, 2, 3],
                   'degrade_seeds': [0],
                   'device': 'auto',
                   'domain': 'web',
                   'engine': 'hf',
                   'dtype': 'auto',
                   'eval_episodes': 1,
                   'eval_seeds': 12,
                   'graft_groups': ['embed', 'attn', 'mlp', 'norm', 'lm_head'],
                   'graft_metric': 'both',
                   'graft_seeds': 4,
                   'grpo_checkpoints': False,
                   'grpo_group': 4,
                   'grpo_max_tokens': 32,
                   'grpo_prompts': 2,
                   'grpo_steps': 6,
                   'grpo_temperature': 1.5,
                   'headroom_calibration': "the degrade regime's rate and temperature",
                   'headroom_k': 4,
                   'headroom_lr': 2e-05,
                   'headroom_seeds': [0],
                   'headroom_tasks': None,
                   'headroom_temperature': 1.5,
                   'kl_seeds': 12,
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
                   'sft_budgets': ['click-button=2000',
                                   'click-link=2000',
                                   'click-tab=1000',
                                   'enter-text=400',
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
#: suites) and the runs of the grid.
GOLDEN_REPR = {'arithmetic-full': 'e4077d6c9baa5d3c719edc959bb603815b9529600148e0ee1d0c98f14403538c',
 'arithmetic-quick': 'ae393f5eb13078200f9280b734063a568f0ed019eb5e92d3cfca20c2830e5075',
 'embedded-full': 'd09d8064bd28845dba394ed8456491f3ee14cd9f3b105c0ad9785b3ee5d43bce',
 'embedded-quick': '91e1f7c74684081567dfbbfbb06d605f031dc2c68cdb489599de0d9cf6baeb52',
 'smollm2-full': 'a13e0945252642bed03f513e48a69811638f8f2335396e029414440a1874104d',
 'smollm2-quick': '66d20f40003069995c3a84bd293baed02ac4521397089c4d857c29c4b30d5f7d'}


#: Fields that say where the study's runs go, not what they compute (every result is the same whatever they are).
NOT_DESIGN = ("workers",)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_gives_the_same_config_as_before(name):
    cfg = StudyConfig.preset("runs/demo", **PRESETS[name])
    design = {k: v for k, v in asdict(cfg).items() if k not in NOT_DESIGN}
    assert json.loads(json.dumps(design, sort_keys=True)) == GOLDEN[name]
    assert hashlib.sha256(repr((design, grid(cfg))).encode()).hexdigest() == GOLDEN_REPR[name]


def test_suites_are_one_table_of_known_disjoint_web_tasks():
    from graftkit.study.design import SUITES
    from graftkit.webenv.tasks import TASKS

    assert set(SUITES) == {"mastered", "headroom", "control"}
    mastered, headroom, control = (set(SUITES[k]) for k in ("mastered", "headroom", "control"))
    assert not mastered & headroom and (mastered | headroom | control) <= set(TASKS)
    assert StudyConfig.preset("runs/demo").suites == SUITES


def test_every_tasks_option_reads_the_study_suites(monkeypatch):
    """``--tasks mastered`` resolves through core.suites, which holds the study's table itself (the design names
    it): a suite changed there is the suite every command plays."""
    from graftkit.agent import resolve_tasks
    from graftkit.agent.tasks import HINT
    from graftkit.core.errors import GraftkitError
    from graftkit.core.suites import suites
    from graftkit.study.design import SUITES
    from graftkit.train.sweep import _tasks

    assert suites() is SUITES and "suites: mastered, headroom, control, all" in HINT
    assert resolve_tasks("headroom, click-tab") == [*SUITES["headroom"], "click-tab"]
    monkeypatch.setitem(SUITES, "mastered", ("enter-text", "focus-text"))
    assert resolve_tasks("mastered") == ["enter-text", "focus-text"] == list(_tasks("mastered"))
    with pytest.raises(GraftkitError, match="unknown task or suite 'nope'"):
        resolve_tasks("click-tab,nope")
