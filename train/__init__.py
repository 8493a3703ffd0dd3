"""Training: SFT, GRPO (losses and variants), checkpointing and resume, sweeps of a control grid."""
