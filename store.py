"""Results as labelled arrays with provenance, one HDF5 file per result.

A :class:`Result` is a few named arrays over named dimensions (``fro_delta[run, tensor]``), the
coordinate labels of each dimension (``tensor = ["model.embed_tokens.weight", ...]``), and attributes:
provenance (config, checkpoint fingerprints, graftkit version) and, per array, its unit or convention.
On disk (h5py): ``/coords/<dim>`` are HDF5 dimension scales attached to every ``/data/<name>`` that uses
that dimension, so any HDF5 tool sees the labels; attributes are stored as JSON strings. Files are
written to a temporary sibling, fsynced and renamed: a reader never sees half a result, and a crash
never damages an earlier one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

import h5py
import numpy as np

from ._version import __version__
from .errors import GraftkitError

_STR = h5py.string_dtype("utf-8")


@dataclass(frozen=True)
class Result:
    """Named arrays over named, labelled dimensions, with provenance."""

    kind: str
    coords: Mapping[str, np.ndarray]
    data: Mapping[str, tuple[tuple[str, ...], np.ndarray]]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    var_attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, (dims, values) in self.data.items():
            if len(dims) != np.ndim(values):
                raise ValueError(f"{name}: {len(dims)} dims for a {np.ndim(values)}-d array")
            for d, n in zip(dims, np.shape(values)):
                if d not in self.coords:
                    raise ValueError(f"{name}: dimension {d} has no coordinate")
                if len(self.coords[d]) != n:
                    raise ValueError(f"{name}: dimension {d} has {len(self.coords[d])} labels, array has {n}")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name][1]

    def dims(self, name: str) -> tuple[str, ...]:
        return self.data[name][0]


@dataclass(frozen=True)
class View:
    """The base of the typed views that results are read through: a :class:`Result` of one of ``KINDS``
    and the file it was read from or written to (named in errors). Each view is defined beside the code
    that produces its result and adds the accessors its readers need."""

    result: Result
    path: Path | None = None

    #: The result kinds this view reads (empty: any).
    KINDS: ClassVar[tuple[str, ...]] = ()
    #: The command that writes such a result (named in the fix of a wrong-kind error).
    PRODUCER: ClassVar[str] = ""

    @classmethod
    def from_result(cls, res: Result, path: str | os.PathLike | None = None):
        if cls.KINDS and res.kind not in cls.KINDS:
            raise GraftkitError(f"{path or 'result'}: a {res.kind!r} result, expected "
                                f"{' or '.join(repr(k) for k in cls.KINDS)}",
                                f"pass a result written by `{cls.PRODUCER}`" if cls.PRODUCER else None)
        return cls(res, None if path is None else Path(path))

    @classmethod
    def read(cls, path: str | os.PathLike):
        return cls.from_result(read_result(path), path)

    def to_result(self) -> Result:
        return self.result

    @property
    def attrs(self) -> Mapping[str, Any]:
        return self.result.attrs

    def labels(self, dim: str) -> list[str]:
        """The coordinate labels of dimension ``dim`` as strings."""
        return [str(x) for x in self.result.coords[dim]]


def _as_h5(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind in ("U", "O"):
        return values.astype(object)
    return values


def _json_default(o: Any) -> Any:
    """numpy scalars and arrays as their Python values (not their str), anything else as its str."""
    if isinstance(o, (np.generic, np.ndarray)):
        return o.tolist()
    return str(o)


def write_result(path: str | os.PathLike, result: Result) -> Path:
    """Write ``result`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["kind"] = result.kind
            f.attrs["graftkit_version"] = __version__
            f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            f.attrs["attrs"] = json.dumps(result.attrs, default=_json_default)
            cg, dg = f.create_group("coords"), f.create_group("data")
            scales = {}
            for dim, labels in result.coords.items():
                arr = _as_h5(labels)
                ds = cg.create_dataset(dim, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
                ds.make_scale(dim)
                scales[dim] = ds
            for name, (dims, values) in result.data.items():
                arr = _as_h5(values)
                ds = dg.create_dataset(name, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
                ds.attrs["dims"] = json.dumps(list(dims))
                ds.attrs["attrs"] = json.dumps(dict(result.var_attrs.get(name, {})), default=_json_default)
                for i, d in enumerate(dims):
                    ds.dims[i].label = d
                    ds.dims[i].attach_scale(scales[d])
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _from_h5(ds: h5py.Dataset) -> np.ndarray:
    if h5py.check_string_dtype(ds.dtype) is not None:
        return np.array(ds.asstr()[()], dtype=object)
    return ds[()]


def read_result(path: str | os.PathLike) -> Result:
    """Load a result written by :func:`write_result`."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            coords = {k: _from_h5(v) for k, v in f["coords"].items()}
            data, var_attrs = {}, {}
            for k, ds in f["data"].items():
                data[k] = (tuple(json.loads(ds.attrs["dims"])), _from_h5(ds))
                var_attrs[k] = json.loads(ds.attrs.get("attrs", "{}"))
            attrs = json.loads(f.attrs["attrs"])
            attrs.setdefault("graftkit_version", f.attrs["graftkit_version"])
            attrs.setdefault("created", f.attrs["created"])
            return Result(str(f.attrs["kind"]), coords, data, attrs, var_attrs)
    except (OSError, KeyError) as exc:
        raise GraftkitError(f"{path}: not a graftkit result file ({exc})", "point at a .h5 written by graftkit") from None


def list_results(run_dir: str | os.PathLike) -> list[dict[str, str]]:
    """Every result file under ``run_dir``: path, kind and creation time, oldest first."""
    out = []
    for p in sorted(Path(run_dir).rglob("*.h5")):
        if p.name.startswith("."):
            continue
        try:
            with h5py.File(p, "r") as f:
                out.append({"path": str(p), "kind": str(f.attrs["kind"]), "created": str(f.attrs["created"])})
        except (OSError, KeyError):
            continue
    return sorted(out, key=lambda r: r["created"])


# -------------------------------------------------------------------------------- the run folder


def runs_root() -> Path:
    """Where run folders live: ``$GRAFTKIT_RUNS``, else ``runs/`` of the current directory."""
    return Path(os.environ.get("GRAFTKIT_RUNS", "runs"))


def current_run() -> Path:
    """The run that commands default to: the one named in ``runs/.current``, else ``runs/demo``."""
    marker = runs_root() / ".current"
    if marker.is_file():
        return Path(marker.read_text().strip())
    return runs_root() / "demo"


def result_labels(paths) -> list[str]:
    """One distinct label per checkpoint path (its folder or file name; the parent's name where two
    share a name), used to name its results and to label it in tables and figures."""
    labels: list[str] = []
    for p in paths:
        lab = Path(p).name.removesuffix(".safetensors") or str(p)
        if lab in labels:
            lab = f"{Path(p).parent.name}-{lab}"
        while lab in labels:
            lab += "'"
        labels.append(lab)
    return labels
