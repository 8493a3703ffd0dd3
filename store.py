"""Results as labelled arrays with provenance, one HDF5 file per result.

A :class:`Result` is a few named arrays over named dimensions (``fro_delta[run, tensor]``), the
coordinate labels of each dimension (``tensor = ["model.embed_tokens.weight", ...]``), and attributes:
provenance (config, checkpoint fingerprints, graftkit version) and, per array, its unit or convention.
On disk the file is netCDF-4-compatible HDF5 (written with h5py), so ``xarray.open_dataset(path,
engine="h5netcdf")`` and netCDF-C read every array with its dimensions and labels:

- ``/<dim>``: the coordinate variable of each dimension, an HDF5 dimension scale named after it;
- ``/<name>``: each array, beside the coordinates in the root group, with the scale of each of its
  dimensions attached (netCDF-4 looks for a variable's dimensions in its own group and its ancestors
  only, so they share one group). An array may not be named after a dimension: netCDF-4 and xarray
  reserve that name for the dimension's coordinate variable (:class:`Result` refuses one);
- strings (labels and arrays) as variable-length UTF-8; booleans as h5py writes them (an HDF5 enum,
  read as ``bool`` by h5netcdf, as ``int8`` by netCDF-C);
- root attributes ``kind``, ``graftkit_version``, ``created`` and ``attrs`` (the provenance, a JSON
  string); per array, ``attrs`` (its unit or convention, a JSON string).

No ``_Netcdf4Dimid``/``_Netcdf4Coordinates`` or ``_NCProperties`` attributes are needed or written:
h5netcdf and netCDF-C take a dimension's name from the dimension scale dataset attached to an axis.
Every dimension has a coordinate variable, so no coordinate-less ("phony") dimension scale is needed.

Files written before this layout (``/coords/<dim>`` scales attached to ``/data/<name>`` in sibling
groups, each array's dimensions in a JSON ``dims`` attribute) are still read by :func:`read_result`
and so by :func:`open_result`; ``xarray.open_dataset`` finds no arrays in them.

Files are written to a temporary sibling, fsynced and renamed: a reader never sees half a result, and a
crash never damages an earlier one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
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
            if name in self.coords:
                raise ValueError(f"{name}: an array named after a dimension (netCDF-4 and xarray keep that name "
                                 f"for the dimension's labels); rename the array, e.g. {name}_value")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name][1]

    def dims(self, name: str) -> tuple[str, ...]:
        return self.data[name][0]

    def to_xarray(self):
        """This result as an ``xarray.Dataset``: one data variable per array (its ``var_attrs`` as its
        attributes), one indexed coordinate per dimension, and ``attrs`` (the provenance, decoded from
        JSON) plus ``kind`` as the dataset's attributes. Needs the ``xarray`` extra."""
        xr = _optional("xarray")
        coords = {d: (d, np.asarray(v)) for d, v in self.coords.items()}
        data_vars = {n: (dims, np.asarray(v), dict(self.var_attrs.get(n, {}))) for n, (dims, v) in self.data.items()}
        return xr.Dataset(data_vars, coords, attrs={**self.attrs, "kind": self.kind})

    def to_dataframe(self, name: str):
        """Array ``name`` as a tidy ``pandas.DataFrame`` (see :func:`tidy_columns`): one column of
        coordinate labels per dimension, then the values, one row per element. Needs pandas."""
        pd = _optional("pandas")
        header, columns = tidy_columns(self, name)
        return pd.DataFrame(dict(zip(header, columns)), columns=header)


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

    def to_xarray(self):
        """The result as an ``xarray.Dataset`` (:meth:`Result.to_xarray`)."""
        return self.result.to_xarray()


def tidy_columns(res: Result, name: str) -> tuple[list[str], list[np.ndarray]]:
    """Array ``name`` of ``res`` as tidy columns: for each dimension its coordinate labels, then the
    values, one entry per element in C (row-major) order; a 0-d array is one row of one column. The
    value column is called ``value`` (the name of the array where a dimension is called ``value``)."""
    dims = res.dims(name)
    values = np.asarray(res[name])
    index = np.unravel_index(np.arange(values.size), values.shape) if values.ndim else ()
    labels = [np.asarray(res.coords[d])[index[k]] for k, d in enumerate(dims)]
    return [*dims, name if "value" in dims else "value"], [*labels, values.reshape(-1)]


def _optional(module: str):
    """Import an optional dependency, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise GraftkitError(f"{module} is not installed (needed to turn results into {module} objects)",
                            "pip install 'graftkit[xarray]'") from None


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


def subject(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The checkpoints a result is about: the sorted content fingerprints (``sha256``) of every checkpoint
    description (a mapping with ``path`` and ``sha256``, as ``weights.describe`` writes) in its provenance."""
    found: set[str] = set()

    def walk(o: Any) -> None:
        if isinstance(o, Mapping):
            if isinstance(o.get("sha256"), str) and "path" in o:
                found.add(o["sha256"])
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(attrs)
    return tuple(sorted(found))


def stored_subject(path: str | os.PathLike) -> tuple[str, ...] | None:
    """:func:`subject` of the result file at ``path`` (read from its attributes only); None when there is no
    readable result there."""
    try:
        with h5py.File(path, "r") as f:
            return subject(json.loads(f.attrs["attrs"]))
    except (OSError, KeyError, ValueError):
        return None


def free_result_path(path: str | os.PathLike, result: Result) -> Path:
    """Where ``result`` may be written without replacing another model's: ``path`` when it is free or holds
    a result about the same checkpoints (a re-run, replaced), else ``path`` with the first 8 hex digits of
    a digest of this result's checkpoints before the suffix (``eval-checkpoint-6-1a2b3c4d.h5``). Two
    trainers' ``checkpoint-6`` folders never share a result file, whatever their labels."""
    import hashlib

    path = Path(path)
    if not path.exists():
        return path
    mine, theirs = subject(result.attrs), stored_subject(path)
    if theirs is not None and mine == theirs:
        return path
    tag = hashlib.sha256("\n".join(mine).encode()).hexdigest()[:8] if mine else "unkeyed"
    return path.with_name(f"{path.stem}-{tag}{path.suffix}")


def write_result(path: str | os.PathLike, result: Result) -> Path:
    """Write ``result`` atomically to ``path``, or — where ``path`` holds a result about other checkpoints —
    beside it (:func:`free_result_path`): an earlier result of another model is never replaced. Returns the
    path written."""
    path = free_result_path(path, result)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["kind"] = result.kind
            f.attrs["graftkit_version"] = __version__
            f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            f.attrs["attrs"] = json.dumps(result.attrs, default=_json_default)
            # netCDF-4: coordinate variables and arrays side by side in the root group (see the module docstring)
            scales = {}
            for dim, labels in result.coords.items():
                arr = _as_h5(labels)
                ds = f.create_dataset(dim, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
                ds.make_scale(dim)
                scales[dim] = ds
            for name, (dims, values) in result.data.items():
                arr = _as_h5(values)
                ds = f.create_dataset(name, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
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


def _dim_name(ds: h5py.Dataset, axis: int) -> str:
    """The dimension of ``axis``: the name of the scale attached to it, as netCDF-4 reads it."""
    scales = ds.dims[axis]
    if len(scales) != 1:
        raise KeyError(f"{ds.name} axis {axis} has {len(scales)} dimension scales, expected 1")
    return scales[0].name.rsplit("/", 1)[-1]


def _read_arrays(f: h5py.File):
    """coords, data and var_attrs of either layout: netCDF-4 (everything in the root group, dimension
    scales are the coordinates) or the one before it (``/coords`` and ``/data`` groups, ``dims`` as JSON)."""
    coords, data, var_attrs = {}, {}, {}
    if isinstance(f.get("coords"), h5py.Group):  # the layout before netCDF-4
        coords = {k: _from_h5(v) for k, v in f["coords"].items()}
        for k, ds in f["data"].items():
            data[k] = (tuple(json.loads(ds.attrs["dims"])), _from_h5(ds))
            var_attrs[k] = json.loads(ds.attrs.get("attrs", "{}"))
        return coords, data, var_attrs
    for k, ds in f.items():
        if not isinstance(ds, h5py.Dataset):
            continue
        if h5py.h5ds.is_scale(ds.id):
            coords[k] = _from_h5(ds)
        else:
            data[k] = (tuple(_dim_name(ds, i) for i in range(ds.ndim)), _from_h5(ds))
            var_attrs[k] = json.loads(ds.attrs.get("attrs", "{}"))
    return coords, data, var_attrs


def read_result(path: str | os.PathLike) -> Result:
    """Load a result written by :func:`write_result` (this layout or the one before it)."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            coords, data, var_attrs = _read_arrays(f)
            attrs = json.loads(f.attrs["attrs"])
            attrs.setdefault("graftkit_version", f.attrs["graftkit_version"])
            attrs.setdefault("created", f.attrs["created"])
            return Result(str(f.attrs["kind"]), coords, data, attrs, var_attrs)
    except (OSError, KeyError) as exc:
        raise GraftkitError(f"{path}: not a graftkit result file ({exc})", "point at a .h5 written by graftkit") from None


def open_result(path: str | os.PathLike):
    """The result in ``path`` as an ``xarray.Dataset`` (:meth:`Result.to_xarray`; files of the layout
    before netCDF-4 too). Needs the ``xarray`` extra."""
    return read_result(path).to_xarray()


def open_run(run_dir: str | os.PathLike) -> dict:
    """Every result of the run in ``run_dir`` (:func:`list_results`, oldest first) as an
    ``xarray.Dataset``, keyed by file stem (by the path below ``run_dir`` without ``.h5`` where two
    files share a stem)."""
    paths = [Path(r["path"]) for r in list_results(run_dir)]
    stems = [p.stem for p in paths]
    out = {}
    for p, stem in zip(paths, stems):
        key = stem if stems.count(stem) == 1 else p.relative_to(Path(run_dir)).with_suffix("").as_posix()
        out[key] = open_result(p)
    return out


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


def current_run(run: str | os.PathLike | None = None) -> Path:
    """The run folder a command writes to and reads from: ``run`` (its ``--run``) when given, else the run
    named in ``runs/.current`` (``graftkit demo`` writes it), else ``runs/`` itself."""
    if run is not None:
        return Path(run)
    marker = runs_root() / ".current"
    if marker.is_file():
        return Path(marker.read_text().strip())
    return runs_root()


#: Folder names that say nothing about which run they belong to: a trainer's step folders
#: (``checkpoint-500``, TRL and transformers' Trainer; ``global_step500``, DeepSpeed) and final ones.
_GENERIC_NAME = re.compile(r"(checkpoint|ckpt|step|global_step|epoch)[-_]?\d+|final|last|best|model|merged|"
                           r"adapter|output|outputs|hf|huggingface", re.IGNORECASE)


def result_labels(paths) -> list[str]:
    """One distinct label per checkpoint path, used to name its results and to label it in tables and
    figures: its folder or file name, prefixed by its parent's where the name says nothing of the run
    (``grpo-lora-checkpoint-6``, not ``checkpoint-6``; see ``_GENERIC_NAME``) or two paths share it."""
    labels: list[str] = []
    for p in paths:
        p = Path(p)
        lab = p.name.removesuffix(".safetensors") or str(p)
        if _GENERIC_NAME.fullmatch(lab) and p.resolve().parent.name:
            lab = f"{p.resolve().parent.name}-{lab}"
        if lab in labels:
            lab = f"{Path(p).parent.name}-{lab}"
        while lab in labels:
            lab += "'"
        labels.append(lab)
    return labels
