"""The typed view of a rank result (weights, delta or activations), the one way readers see one.

Light on purpose (numpy and the store only): the report reads rank results through it without loading
torch or the spectral code.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..results.layout import RANK_ACTIVATIONS, RANK_KINDS
from ..results.store import View
from .metrics import METRICS, PAIR_METRICS  # noqa: F401  (the registry's names: value's metric order, and delta's)

#: Activation ranks: which tokens of a probe prompt, and which way hidden states are read.
TOKENS = ("last", "all")
BACKENDS = ("hooks", "lens")


@dataclass(frozen=True)
class RankResult(View):
    """A rank result read by name, whichever layout it has.

    ``rank-weights`` / ``rank-delta`` (:mod:`.weights`): ``value[tensor, metric]`` and per decoder layer
    ``value_layer[layer, group, metric]`` (group ``"all"``: every matrix of the layer), each cell the mean of
    every metric over one set of matrices (the nonzero ones; for a delta, those RL moved), named in
    ``averaged_layer``.
    ``rank-activations`` (:mod:`.activations`): ``value[layer, metric]`` over hidden-state indices and
    ``block[layer]``, the decoder block whose output each hidden state is (−1: the embedding output).
    ``path`` is the file it was read from (named in errors)."""

    KINDS = RANK_KINDS
    PRODUCER = "graftkit rank"

    @property
    def kind(self) -> str:
        return self.result.kind

    @property
    def metrics(self) -> list[str]:
        return [str(m) for m in self.result.coords.get("metric", [])]

    @property
    def model_path(self) -> str | None:
        """The ranked checkpoint's path as recorded (``attrs["model"]["path"]``), normalised."""
        model = self.attrs.get("model")
        return os.path.normpath(str(model["path"])) if isinstance(model, dict) and model.get("path") else None

    @property
    def layer_ids(self) -> list[int]:
        """Decoder layer indices of the rows: the layer coordinate, or for activation ranks the decoder block
        whose output each hidden state is (the embedding output, block −1, is left out)."""
        if self.kind == RANK_ACTIVATIONS:
            return [int(b) for b in self.result["block"] if b >= 0]
        return [int(L) for L in self.result.coords["layer"]]

    @property
    def n_layers(self) -> int:
        """The model's decoder depth as the result records it (attrs n_layers, else its band rule)."""
        if self.kind == RANK_ACTIVATIONS:
            return len(self.layer_ids)
        if self.attrs.get("n_layers"):
            return int(self.attrs["n_layers"])
        m = re.search(r"with n = (\d+)", str(self.attrs.get("band_rule", "")))
        return int(m[1]) if m else int(max(self.result.coords["layer"], default=-1)) + 1

    def layer_values(self, metric: str) -> np.ndarray:
        """``metric`` at :attr:`layer_ids`: value_layer[:, group "all", metric] (value_layer[:, metric] for a
        result without groups); for activation ranks value[:, metric] of the decoder blocks' outputs."""
        res, metrics = self.result, self.metrics
        if self.kind == RANK_ACTIVATIONS and metric in metrics:
            return np.asarray(res["value"])[np.asarray(res["block"]) >= 0, metrics.index(metric)]
        if "value_layer" not in res.data or metric not in metrics:
            raise GraftkitError(f"{self.path}: no per-layer '{metric}' (metrics: {', '.join(metrics) or 'none'})",
                                f"pass --metric one of {', '.join(metrics)}" if metrics else "re-run graftkit rank")
        dims, v = res.dims("value_layer"), res["value_layer"]
        k = metrics.index(metric)
        if dims == ("layer", "group", "metric"):
            return v[:, [str(g) for g in res.coords["group"]].index("all"), k]
        if dims == ("layer", "metric"):
            return v[:, k]
        raise GraftkitError(f"{self.path}: value_layer has dims {list(dims)}",
                            "expected [layer, group, metric] or [layer, metric]")

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(the layer coordinate, values[layer, metric] in float64): group "all" (else the first group) of
        value_layer for weights and delta; value over hidden-state indices (0 = embeddings) for activations."""
        res = self.result
        if "value_layer" in res.data:
            dims = res.dims("value_layer")
            groups = [str(g) for g in res.coords["group"]]
            v = np.asarray(res["value_layer"], dtype=np.float64)
            v = np.moveaxis(v, [dims.index("layer"), dims.index("group"), dims.index("metric")], [0, 1, 2])
            return np.asarray(res.coords["layer"]), v[:, groups.index("all") if "all" in groups else 0, :]
        dims = res.dims("value")
        v = np.asarray(res["value"], dtype=np.float64)
        return np.asarray(res.coords["layer"]), np.moveaxis(v, [dims.index("layer"), dims.index("metric")], [0, 1])

    def layer_rows(self, shown: Sequence[str]) -> list[dict]:
        """One row per layer of the shown metrics (weights/delta: group "all" and each group's means;
        activations: the hidden state's block and token count)."""
        res = self.result
        mi = [self.metrics.index(m) for m in shown]
        if self.kind == RANK_ACTIVATIONS:
            return [{"layer": int(L), "block": int(res["block"][i]) if res["block"][i] >= 0 else None,
                     "n_tokens": int(res["n_tokens"][i]), **{m: float(res["value"][i, k]) for m, k in zip(shown, mi)}}
                    for i, L in enumerate(res.coords["layer"])]
        groups = list(res.coords["group"])
        over = self.averaged_over()

        def cell(i: int, j: int) -> dict:
            vals = {m: float(res["value_layer"][i, j, k]) for m, k in zip(shown, mi)}
            return {**vals, "averaged_over": over[i][j]} if over is not None else vals

        return [{"layer": int(L), **cell(i, len(groups) - 1),
                 "groups": {g: cell(i, j) for j, g in enumerate(groups[:-1]) if res["count_layer"][i, j]}}
                for i, L in enumerate(res.coords["layer"])]

    def averaged_over(self) -> list[list[str]] | None:
        """Per layer and group (weights/delta), the set of matrices every measure of that cell is the mean
        over (``averaged_layer``, e.g. "moved tensors 2 of 7: self_attn.q_proj.weight, ..."); None for
        activation ranks and for results written before the set was recorded."""
        res = self.result
        if "averaged_layer" not in res.data:
            return None
        return [[str(x) for x in row] for row in np.asarray(res["averaged_layer"])]

    def principal(self) -> list[dict]:
        """A delta result's principal-direction measures per group and over every moved matrix ("all"): the
        mean over the matrices RL moved of the share of ‖Δ‖² in W₀'s top-k left and right singular subspaces,
        each beside its exact chance (a random Δ's share), and of the top-k subspace overlap of W₀ and W₁.
        Empty for a result without them (weights, activations, or written before they were measured)."""
        res = self.result
        names = ("delta_energy_top8", "delta_energy_top8_chance", "delta_energy_top8_right",
                 "delta_energy_top8_right_chance", "subspace_overlap_top8")
        if self.kind == RANK_ACTIVATIONS or not set(names) <= set(self.metrics) or "frobenius_sq" not in self.metrics:
            return []
        v = np.asarray(res["value"], dtype=np.float64)
        moved = v[:, self.metrics.index("frobenius_sq")] > 0
        groups = np.array([str(g) for g in res["tensor_group"]])
        out = []
        for g in [*dict.fromkeys(groups[moved]), "all"]:
            rows = moved & ((groups == g) if g != "all" else True)
            if rows.any():
                out.append({"group": g, "matrices": int(rows.sum()),
                            **{n: float(v[rows, self.metrics.index(n)].mean()) for n in names}})
        return out

    def outside_rows(self, shown: Sequence[str]) -> list[dict]:
        """The shown metrics of every tensor outside the decoder stack (weights/delta)."""
        res = self.result
        mi = [self.metrics.index(m) for m in shown]
        return [{"tensor": str(n), "group": str(res["tensor_group"][t]),
                 **{m: float(res["value"][t, k]) for m, k in zip(shown, mi)}}
                for t, n in enumerate(res.coords["tensor"]) if res["tensor_layer"][t] < 0]


def principal_tables(label: str, rows: Sequence[dict] | None) -> list:
    """What ``graftkit rank --what delta`` prints of :meth:`RankResult.principal`: per group, where Δ lies against
    W's top-k singular directions, each share beside its exact chance, and the W/W′ top-k subspace overlap."""
    from ..core.tables import Table
    from .metrics import DELTA_TOPK

    if not rows:
        return []

    def pct(key: str):
        return lambda r: f"{100 * r[key]:.2f}%"

    return [Table(f"{label}: where Δ lies against W's top-{DELTA_TOPK} singular directions (means over the matrices "
                  "RL moved; chance: a random Δ's share, exact)",
                  {"group": lambda r: r["group"], "matrices": lambda r: str(r["matrices"]),
                   "left share": pct("delta_energy_top8"), "chance": pct("delta_energy_top8_chance"),
                   "right share": pct("delta_energy_top8_right"), "chance ": pct("delta_energy_top8_right_chance"),
                   "W/W′ top-k overlap": lambda r: f"{r['subspace_overlap_top8']:.4f}"},
                  rows, left=("group",))]
