"""Checkpoints as distributed trainers write them, read where they lie, at the trainer's own precision.

Each layout family is one reader (:class:`~..reader.Reader`, registered in :data:`..checkpoint.READERS`), recognised
by what is on disk and read by its own module, one tensor at a time, without a process group, a GPU, or the
trainer's library:

- :mod:`.dcp`: ``torch.distributed.checkpoint`` folders (FSDP2 + ``dcp.save``, torchtitan ``step-N/``, accelerate's
  and the Trainer's ``pytorch_model_fsdp_0/``);
- :mod:`.deepspeed`: DeepSpeed ``global_stepN/`` (ZeRO 0–3; the fp32 master weights from the optimizer partitions);
- :mod:`.verl`: verl's FSDP actor checkpoints (``global_step_N/actor/``: the ranks' fp32 shards joined);
- :mod:`.megatron`: Megatron-Core ``torch_dist``, which graftkit recognises but does not read: one error naming its
  converter.

Every layout here is pickled, and read by default through graftkit's restricted unpickler: each piece with
``torch.load(weights_only=True)`` admitting only its format's own classes (DeepSpeed's as inert stand-ins, DTensor's
for verl), DCP's metadata with an unpickler that builds only DCP's metadata classes; anything else in a pickle is
refused, naming it. ``--no-pickle`` refuses the layouts altogether.
"""
