"""Spectral ranks of a model's hidden states on probe prompts, per layer, from streamed fp64 moments.

What is measured. For each selected layer, the token vectors x ∈ R^d picked from every probe prompt form
an N×d activation matrix X that is never stored: each batch adds its rows to float64 moments
(count n, Σx [d], Σxxᵀ [d, d]) and is dropped, so memory holds one batch's hidden states and a d×d
matrix per layer, however many prompts there are. From the moments:

- centred covariance  C = (Σxxᵀ − n μμᵀ) / n,  μ = Σx / n   (divides by n, not n − 1);
- uncentred second moment  M = Σxxᵀ / n.

λ = eigvalsh(C or M) in float64; eigenvalues at or below max(n, d)·eps64·λ₁ (tiny negative ones
included) are set to 0, the rounding floor rule of ``spectra``'s Gram route. σ = sqrt(n·λ) are then
exactly the singular values of X (centred: of X − 1μᵀ), since XᵀX = n·M and (X − 1μᵀ)ᵀ(X − 1μᵀ) = n·C;
the largest min(n, d) are kept, the length of X's spectrum. So every measure equals
``spectra.measures`` on the explicitly stacked matrix (``tests/test_rank_activations.py`` checks it
against an fp64 SVD): erank, erank_sq, stable_rank, participation_ratio (on λ), rankme, numerical_rank,
top1_energy, sigma_1 and frobenius_sq. Numerical rank counts σ > max(n, d)·eps(activation dtype)·σ₁.

Which vectors. Layer L is a hidden-state index 0..n_layers: L = 0 is the input of decoder block 0 (the
embedding output, after any embedding scale), L ≥ 1 the output of decoder block L − 1, i.e. the residual
stream after that block — TransformerLens' ``blocks.{L-1}.hook_resid_post`` and HF's
``hidden_states[L]`` for L < n_layers. HF's last hidden state ``hidden_states[n_layers]`` has the final
norm applied; here L = n_layers is the last block's output *before* the final norm, like every other
layer. ``layers`` uses the band rule on decoder blocks (``weights.parse_layers``): ``late`` selects
blocks of the late third and therefore hidden states L = block + 1; ``all`` adds L = 0.
Tokens: ``"last"`` takes each prompt's last token, ``"all"`` every token; position 0 (the BOS or
first template token, an attention sink with outlying norm) is always dropped, so a one-token prompt
contributes nothing. Batches are right-padded and padded positions never enter the moments.

Backends. ``"hooks"``: forward hooks on the decoder blocks of any HF causal LM (the ``ModuleList`` of
``config.num_hidden_layers`` blocks inside ``model.get_decoder()``), the forward stopped after the
deepest selected block. ``"lens"``: TransformerLens 4.x ``TransformerBridge.boot_transformers`` on the
same model and ``run_with_cache`` of ``blocks.{i}.hook_resid_post`` (``blocks.0.hook_resid_pre`` for
L = 0). Both are fed the same explicit token ids (TransformerLens would otherwise prepend its own
BOS). TransformerBridge rewires the model's blocks in place and switches it to eager attention, so by
default it boots on a deep copy; ``give_model=True`` hands it the model instead.

Prompts. :func:`probe_prompts` renders the first observation of fixed-seed episodes of the web tasks in
the policy's own format (``agent.evaluate.first_prompts``);
:func:`prompts_from_file` reads one prompt per non-empty line. :func:`encode_prompt` tokenises a prompt
as :meth:`agent.Policy.prompt_ids` does for a first turn: BOS + tokens, or the chat template's
one-turn conversation when the tokenizer has one.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..results.layout import RANK_ACTIVATIONS
from ..results.store import Result
from ..weights import band_rule, parse_layers
from .metrics import of_spectrum
from .spectra import CONVENTIONS, METHODS, RANKME_EPS, Spectrum, numerical_rank, rankme
from .results import BACKENDS, METRICS, TOKENS

_EPS64 = float(np.finfo(np.float64).eps)

COVARIANCE_CONVENTION = {
    "centred": "C = (sum(x x^T) - n mu mu^T) / n, mu = sum(x)/n (divide by n, not n-1)",
    "uncentred": "M = sum(x x^T) / n (second moment)",
    "accumulation": "count, sum(x) [d], sum(x x^T) [d,d] in float64, added batch by batch; no activation stored",
}
SPECTRUM_CONVENTION = ("lambda = eigvalsh(C or M) in float64; lambda <= max(n,d)*eps64*lambda_1 set to 0 (tiny "
                       "negatives clipped); sigma = sqrt(n*lambda) = singular values of the stacked n x d activation "
                       "matrix (centred: minus its column mean), top min(n,d) kept")
LAYER_CONVENTION = ("layer = hidden-state index: 0 = input of decoder block 0 (embedding output), L = output of "
                    "decoder block L-1 (residual stream, before the final norm also for the last block); "
                    "= TransformerLens blocks.{L-1}.hook_resid_post = HF hidden_states[L] for L < n_layers")
TOKEN_CONVENTION = {"last": "each prompt's last token; position 0 dropped (a 1-token prompt contributes nothing)",
                    "all": "every token except position 0; right padding, padded positions excluded"}
TOL_RULE = "max(n_tokens, d)*eps(activation dtype)*sigma_1 (absolute, on sigma = sqrt(n*lambda))"


# ---------------------------------------------------------------------------------------------------
# probe prompts


def probe_prompts(tasks: str | Sequence[str], n: int, seed: int = 0) -> list[str]:
    """``n`` first-turn prompts from the web tasks: prompt k is episode ``seed + k // T`` of task
    ``k mod T`` (T tasks, a suite name or task list), rendered as the policy reads it."""
    from ..agent.evaluate import first_prompts

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GraftkitError(f"probe prompts: n={n!r} must be a positive integer", "pass --probes 64 or more")
    return first_prompts(tasks, n, seed)


def prompts_from_file(path: str | Path) -> list[str]:
    """One prompt per non-empty line of a UTF-8 text file (surrounding whitespace stripped)."""
    path = Path(path)
    if not path.is_file():
        raise GraftkitError(f"{path}: no such probe file", "pass a text file with one prompt per line")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise GraftkitError(f"{path}: not UTF-8 text", "save the probe file as UTF-8, one prompt per line") from None
    prompts = [s.strip() for s in lines if s.strip()]
    if not prompts:
        raise GraftkitError(f"{path}: the probe file has no non-empty line", "write one prompt per line")
    return prompts


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as the policy reads a first-turn prompt (see the module docstring)."""
    from ..agent.policy import SYSTEM

    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------------------------------
# moments (pure)


@dataclass(frozen=True, eq=False)
class Moments:
    """Streaming float64 moments of a set of row vectors x ∈ R^d."""

    count: int  # n, number of rows
    total: Any  # Σx, torch float64 [d]
    outer: Any  # Σxxᵀ, torch float64 [d, d]


def moments(X) -> Moments:
    """The moments of the rows of ``X [N, d]`` (upcast to float64 before any product)."""
    X64 = X.detach().double()
    return Moments(int(X64.shape[0]), X64.sum(0), X64.T @ X64)


def accumulate(m: Moments | None, X) -> Moments:
    """``m`` plus the rows of ``X [N, d]`` (one fresh d×d sum, no intermediate Gram)."""
    import torch

    if m is None:
        return moments(X)
    X64 = X.detach().to(device=m.outer.device, dtype=torch.float64)
    if X64.shape[1] != m.outer.shape[0]:
        raise GraftkitError(f"moments: rows of width {X64.shape[1]} added to moments of width {m.outer.shape[0]}",
                            "accumulate one layer's hidden states per Moments")
    return Moments(m.count + int(X64.shape[0]), m.total + X64.sum(0), torch.addmm(m.outer, X64.T, X64))


def merge(a: Moments, b: Moments) -> Moments:
    """Moments of the union of two row sets (e.g. two shards of prompts)."""
    if a.outer.shape != b.outer.shape:
        raise GraftkitError(f"merge: moments of width {a.outer.shape[0]} and {b.outer.shape[0]}",
                            "merge moments of the same layer")
    return Moments(a.count + b.count, a.total + b.total.to(a.total.device), a.outer + b.outer.to(a.outer.device))


def second_moment(m: Moments, centred: bool) -> np.ndarray:
    """C (centred covariance) or M (uncentred second moment), float64 [d, d], dividing by n."""
    if m.count < 1:
        raise GraftkitError("no token vectors were collected", "pass longer prompts (position 0 is dropped)")
    S = m.outer.detach().cpu().double().numpy()
    if not centred:
        return S / m.count
    mu = m.total.detach().cpu().double().numpy() / m.count
    return (S - m.count * np.outer(mu, mu)) / m.count


def activation_spectrum(m: Moments, centred: bool, dtype: str = "float32") -> Spectrum:
    """σ of the stacked (centred) N×d activation matrix, from its moments: σ = sqrt(n·λ).

    ``dtype`` is the dtype the activations were computed in; it sets the numerical-rank tolerance.
    """
    import torch

    C = second_moment(m, centred)
    C = (C + C.T) / 2  # exact symmetry; eigvalsh reads one triangle
    if not np.isfinite(C).all():
        raise GraftkitError("the hidden states hold NaN or inf values", "check the model (overflow in its dtype?)")
    n, d = m.count, C.shape[0]
    lam = np.linalg.eigvalsh(C)[::-1].copy()  # descending
    lam[lam <= max(n, d) * _EPS64 * max(float(lam[0]), 0.0)] = 0.0
    sigma = np.sqrt(n * lam[: min(n, d)])
    eps = float(torch.finfo(getattr(torch, dtype)).eps)
    return Spectrum(sigma=sigma, shape=(n, d), dtype=dtype, dtype_eps=eps, method=METHODS["gram"])


def spectrum_measures(sp: Spectrum, rankme_eps: float = RANKME_EPS) -> dict[str, float]:
    """``METRICS`` of one spectrum (:func:`graftkit.rank.metrics.of_spectrum`: NaN ratios for a zero spectrum), as
    ``spectra.measures`` names them."""
    s = sp.sigma
    values = of_spectrum(s, numerical_rank(s, tol=sp.default_tol()) if s.any() else 0.0)
    if s.any():
        values["rankme"] = rankme(s, rankme_eps)
    return values


# ---------------------------------------------------------------------------------------------------
# token selection and batching (pure)


def select_tokens(hidden, mask, tokens: str):
    """Rows of ``hidden [B, T, d]`` to add to the moments: ``[N, d]``.

    ``mask [B, T]`` is the right-padded attention mask (1 on real tokens). Position 0 is never taken.
    """
    if tokens == "last":
        last = mask.sum(1) - 1  # right padding: index of the last real token
        keep = last >= 1
        rows = hidden[keep.nonzero().squeeze(1), last[keep]]
        return rows
    if tokens == "all":
        sel = mask.bool().clone()
        sel[:, 0] = False
        return hidden[sel]
    raise GraftkitError(f"token selection {tokens!r}", f"use one of {', '.join(TOKENS)}")


def batches(ids: Sequence[Sequence[int]], batch_size: int, pad_id: int) -> Iterator[tuple[Any, Any, int]]:
    """Right-padded ``(ids [B, T], mask [B, T], n_prompts)`` batches, prompts grouped by length."""
    import torch

    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for k in range(0, len(order), batch_size):
        chunk = [ids[i] for i in order[k : k + batch_size]]
        T = max(len(c) for c in chunk)
        x = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), T), dtype=torch.long)
        for r, c in enumerate(chunk):
            x[r, : len(c)] = torch.tensor(c, dtype=torch.long)
            mask[r, : len(c)] = 1
        yield x, mask, len(chunk)


# ---------------------------------------------------------------------------------------------------
# backends (the model runs here)


class _Stop(Exception):
    """Raised from the deepest selected block's hook: nothing after it is needed."""


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def n_decoder_layers(model) -> int:
    n = getattr(_text_config(model), "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise GraftkitError(f"{type(model).__name__}: its config has no num_hidden_layers",
                            "pass an HF causal LM (or its policy)")
    return n


def decoder_blocks(model) -> tuple[Any, Any]:
    """``(decoder, blocks)``: the module that runs the text decoder (no output head) and its list of
    ``num_hidden_layers`` blocks, found by length (any architecture)."""
    import torch

    n = n_decoder_layers(model)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    for name, mod in decoder.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and not any(
                k in name for k in ("vision", "visual")):
            return decoder, mod
    raise GraftkitError(f"{type(model).__name__}: no list of {n} decoder blocks found",
                        "pass an HF causal LM whose blocks sit in one ModuleList")


def hooks_runner(model, selected: Sequence[int], consume: Callable[[int, Any], None]):
    """A function ``run(ids, mask)`` that calls ``consume(L, hidden [B, T, d])`` for each selected L."""
    decoder, blocks = decoder_blocks(model)
    deepest = max(selected)

    def run(ids, mask):
        handles = []
        if 0 in selected:
            def pre(mod, args, kwargs):
                consume(0, args[0] if args else kwargs["hidden_states"])
            handles.append(blocks[0].register_forward_pre_hook(pre, with_kwargs=True))
        for L in selected:
            if L == 0:
                continue

            def post(mod, args, out, L=L):
                consume(L, out[0] if isinstance(out, (tuple, list)) else out)
                if L == deepest:
                    raise _Stop
            handles.append(blocks[L - 1].register_forward_hook(post))
        try:
            if deepest == 0:
                def stop(mod, args, kwargs):
                    raise _Stop
                handles.append(blocks[0].register_forward_pre_hook(stop, with_kwargs=True))
            decoder(input_ids=ids, attention_mask=mask, use_cache=False)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
    return run


def lens_supports(model) -> tuple[bool, str]:
    """(whether TransformerLens has a bridge for the model's architecture, the architecture name)."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    archs = [type(model).__name__, *(getattr(model.config, "architectures", None) or [])]
    return any(a in SUPPORTED_ARCHITECTURES for a in archs), archs[0]


def _lens_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformer-lens")
    except PackageNotFoundError:
        return "4.x"


def lens_runner(model, tokenizer, path, selected: Sequence[int], consume, give_model: bool):
    import torch

    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        raise GraftkitError("--backend lens needs transformer-lens, which is not installed",
                            "pip install 'graftkit[lens]' (transformer-lens==4.3.0), or use --backend hooks") from None
    ok, arch = lens_supports(model)
    version = _lens_version()
    if not ok:
        raise GraftkitError(f"TransformerLens {version} has no TransformerBridge for {arch}",
                            f"use --backend hooks, which supports {arch} (any HF causal LM)")
    n = n_decoder_layers(model)
    hf = model if give_model else copy.deepcopy(model)
    tok = copy.deepcopy(tokenizer)
    # TransformerBridge re-loads a tokenizer from its name unless add_bos_token is already set; the ids
    # are given explicitly, so the tokenizer is never used to encode
    tok.init_kwargs["name_or_path"] = str(path)
    tok.init_kwargs["add_bos_token"] = True
    dtype = next(hf.parameters()).dtype
    try:
        bridge = TransformerBridge.boot_transformers(str(path), hf_model=hf, tokenizer=tok,
                                                     device=str(next(hf.parameters()).device), dtype=dtype)
    except Exception as exc:  # TransformerLens raises many types for a model it cannot wrap
        raise GraftkitError(f"TransformerLens {version} cannot wrap {arch}: {exc}".splitlines()[0],
                            f"use --backend hooks, which supports {arch}") from None
    names = {("blocks.0.hook_resid_pre" if L == 0 else f"blocks.{L - 1}.hook_resid_post"): L for L in selected}
    stop = max(selected)
    stop_at = stop if stop < n else None  # stop_at_layer=k runs blocks 0..k-1

    def run(ids, mask):
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids, attention_mask=mask, names_filter=list(names),
                                             stop_at_layer=stop_at, return_cache_object=False)
        for name, L in sorted(names.items(), key=lambda kv: kv[1]):
            consume(L, cache.pop(name))
        del cache
    return run


# ---------------------------------------------------------------------------------------------------
# the measurement


def hidden_state_layers(layers: str, n_layers: int) -> list[int]:
    """Hidden-state indices for a ``parse_layers`` spec on decoder blocks: block i → L = i + 1; ``all``
    → 0..n_layers (the embedding output included)."""
    chosen = parse_layers(layers, n_layers)
    if chosen is not None and not chosen:
        raise GraftkitError(f"--layers {layers} selects no decoder block of this {n_layers}-layer model "
                            f"({band_rule(n_layers)})", "pick another band or explicit block indices")
    return list(range(n_layers + 1)) if chosen is None else sorted(i + 1 for i in chosen)


def _describe(model, path, checkpoint: dict | None = None) -> dict:
    cfg = _text_config(model)
    desc = {"class": type(model).__name__, "architectures": list(getattr(model.config, "architectures", None) or []),
            "n_layers": n_decoder_layers(model), "d_model": int(getattr(cfg, "hidden_size", 0) or 0)}
    if checkpoint is None and path is not None:
        from ..weights import describe, open_checkpoint

        checkpoint = describe(open_checkpoint(Path(path)))
    return {**desc, **(checkpoint or {})}


def activation_ranks(
    policy_or_model,
    tokenizer=None,
    prompts: Sequence[str] = (),
    layers: str = "all",
    tokens: str = "last",
    centred: bool = True,
    backend: str = "hooks",
    batch_size: int = 8,
    on_batch: Callable[[int], None] = lambda n_prompts: None,
    *,
    path: str | Path | None = None,
    give_model: bool = False,
    rankme_eps: float = RANKME_EPS,
    provenance: dict | None = None,
    checkpoint: dict | None = None,
) -> Result:
    """Spectral measures of the hidden states at each selected layer over ``prompts``.

    ``policy_or_model``: an ``agent.Policy`` (its model, tokenizer and path are used) or an HF causal LM
    with ``tokenizer``. ``on_batch(n)`` is called after each batch of n prompts. ``path``: the model's
    folder (fingerprinted into the result; TransformerBridge's model name); ``checkpoint``: its
    ``weights.describe`` record where it was read otherwise (a single file: pickled, over a --config). Returns a ``Result`` of kind
    ``"rank-activations"``: ``value[layer, metric]`` (``METRICS``), ``n_tokens[layer]``,
    ``block[layer]`` (decoder block whose output it is, −1 for the embedding output) and ``tol[layer]``;
    attrs carry every convention (see the module docstring).
    """
    model, tokenizer, path = _model_and_tokenizer(policy_or_model, tokenizer, path)
    prompts = list(prompts)
    _check_options(tokens, backend, batch_size, prompts)
    n_layers = n_decoder_layers(model)
    selected = hidden_state_layers(layers, n_layers)
    ids = _probe_ids(model, tokenizer, prompts)
    device = next(model.parameters()).device  # before a lens backend boots over the model
    act_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    sink = _LayerMoments(dict.fromkeys(selected), tokens)
    path_name = path if path is not None else (getattr(model.config, "name_or_path", "") or type(model).__name__)
    run = (hooks_runner(model, selected, sink.consume) if backend == "hooks"
           else lens_runner(model, tokenizer, path_name, selected, sink.consume, give_model))
    t0 = time.perf_counter()
    _feed(run, sink, ids, batch_size, tokenizer, device, on_batch)
    values, counts, tols = _layer_measures(sink.moments, centred, act_dtype, rankme_eps)
    coords = {"layer": np.array(selected, dtype=np.int64), "metric": np.array(METRICS, dtype=object)}
    data = {
        "value": (("layer", "metric"), np.array(values, dtype=np.float64)),
        "n_tokens": (("layer",), np.array(counts, dtype=np.int64)),
        "block": (("layer",), np.array(selected, dtype=np.int64) - 1),
        "tol": (("layer",), np.array(tols, dtype=np.float64)),
    }
    attrs = {
        **_conventions(tokens, centred, backend, layers, n_layers, rankme_eps, act_dtype),
        "n_prompts": len(prompts),
        "batch_size": batch_size,
        "padding": "right",
        "model": _describe(model, path, checkpoint),
        "seconds": time.perf_counter() - t0,
        **(provenance or {}),
    }
    return Result(RANK_ACTIVATIONS, coords, data, attrs)


def _model_and_tokenizer(policy_or_model, tokenizer, path):
    """The model, its tokenizer and its folder: an ``agent.Policy``'s own, or an HF causal LM's with the
    ``tokenizer`` and ``path`` given."""
    import torch

    is_model = isinstance(policy_or_model, torch.nn.Module)  # an HF CausalLM also has a .model attribute
    model = policy_or_model if is_model else policy_or_model.model
    if tokenizer is None and not is_model:
        tokenizer = policy_or_model.tokenizer
    if path is None and not is_model:
        path = getattr(policy_or_model, "path", None)
    if tokenizer is None:
        raise GraftkitError("activation_ranks needs a tokenizer", "pass a Policy, or the model and its tokenizer")
    return model, tokenizer, path


def _check_options(tokens: str, backend: str, batch_size: int, prompts: Sequence[str]) -> None:
    if tokens not in TOKENS:
        raise GraftkitError(f"--tokens {tokens!r} is not an option", f"use one of {', '.join(TOKENS)}")
    if backend not in BACKENDS:
        raise GraftkitError(f"--backend {backend!r} is not an option", f"use one of {', '.join(BACKENDS)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise GraftkitError(f"batch_size={batch_size!r} must be a positive integer", "use e.g. 8")
    if not prompts:
        raise GraftkitError("no probe prompts", "pass --probes N (from the tasks) or --probe-file PATH")


def _probe_ids(model, tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """The token ids of every probe prompt (:func:`encode_prompt`); a prompt longer than the model's context
    is refused, naming the longest."""
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    ctx = getattr(_text_config(model), "max_position_embeddings", None)
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    if isinstance(ctx, int) and len(ids[longest]) > ctx:
        raise GraftkitError(f"probe prompt {longest} has {len(ids[longest])} tokens, more than the model's "
                            f"{ctx} positions", "pass shorter prompts (--probe-file) or a model with a longer context")
    return ids


@dataclass
class _LayerMoments:
    """The moments of each selected layer so far, which a backend's ``consume(L, hidden)`` adds to: the
    token rows ``tokens`` selects under the current batch's ``mask``."""

    moments: dict[int, Moments | None]
    tokens: str
    mask: Any = None

    def consume(self, L: int, hidden) -> None:
        self.moments[L] = accumulate(self.moments[L], select_tokens(hidden.detach(), self.mask, self.tokens))


def _feed(run, sink: _LayerMoments, ids: list[list[int]], batch_size: int, tokenizer, device,
          on_batch: Callable[[int], None]) -> None:
    """Run every right-padded batch of ``ids`` through ``run(ids, mask)`` without gradients, ``sink`` holding
    the batch's mask while the backend hands it the hidden states."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with torch.no_grad():
        for x, mask, n in batches(ids, batch_size, pad):
            sink.mask = mask.to(device)
            run(x.to(device), sink.mask)
            on_batch(n)


def _layer_measures(moments: dict[int, Moments | None], centred: bool, act_dtype: str, rankme_eps: float):
    """Per selected layer (in order): the ``METRICS`` of its activation spectrum, its token count and its
    numerical-rank tolerance."""
    values, counts, tols = [], [], []
    for L, m in moments.items():
        if m is None or m.count == 0:
            raise GraftkitError(f"no token vectors at layer {L}: every probe prompt has a single token",
                                "pass longer prompts (position 0 is dropped)")
        sp = activation_spectrum(m, centred, act_dtype)
        meas = spectrum_measures(sp, rankme_eps)
        values.append([meas[k] for k in METRICS]), counts.append(m.count), tols.append(sp.default_tol())
    return values, counts, tols


def _conventions(tokens: str, centred: bool, backend: str, layers: str, n_layers: int, rankme_eps: float,
                 act_dtype: str) -> dict[str, Any]:
    """Every convention of an activation-rank result, stored beside its values (see the module docstring)."""
    return {
        "what": "activations",
        "conventions": {**CONVENTIONS, "sigma_1": "largest singular value of the stacked activation matrix",
                        "frobenius_sq": "sum(sigma^2) = n*trace(C or M)", **COVARIANCE_CONVENTION},
        "spectrum": SPECTRUM_CONVENTION,
        "method": METHODS["gram"] + " (d x d, accumulated over batches)",
        "dtype": "float64 covariance",
        "activation_dtype": act_dtype,
        "tokens": tokens,
        "token_selection": TOKEN_CONVENTION[tokens],
        "position_0": "dropped",
        "centred": bool(centred),
        "centring": COVARIANCE_CONVENTION["centred" if centred else "uncentred"],
        "backend": backend,
        "hook_points": ("forward hooks: output of decoder block L-1, input of block 0 for L=0" if backend == "hooks"
                        else "TransformerLens blocks.{L-1}.hook_resid_post, blocks.0.hook_resid_pre for L=0"),
        "layer_convention": LAYER_CONVENTION,
        "layers": layers,
        "band_rule": band_rule(n_layers),
        "numerical_rank_tol_rule": TOL_RULE,
        "rankme_eps": rankme_eps,
    }
