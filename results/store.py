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

Files are built in memory, checked against the free space, written to a temporary sibling, fsynced,
renamed and the folder fsynced (:func:`graftkit.core.files.write_atomic`): a reader never sees half a result, a
crash never damages an earlier one, and a full disk is one error, never HDF5 closing a half-written file.
A file that cannot be read (truncated, not HDF5, garbled attributes) is a :class:`DamagedResult` saying
why; :func:`scan_results` returns the readable results of a run and names the damaged ones.
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

from .._version import __version__
from ..core.config import CommandConfig, opt
from ..core.errors import GraftkitError
from ..core.files import check_file_dest, find_stale, remove, write_atomic
from .layout import SUFFIX, current_run, result_files, with_tag

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


#: The dataset attribute that marks a string array written with :func:`_escape_nul` (HDF5's variable-length
#: strings end at a NUL, and a decoded token of a byte-level tokenizer may be one).
ESCAPED_NUL = "escaped_nul"


def _escape_nul(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """``arr`` with every NUL written as ``\\0`` and every backslash as ``\\\\`` when any string holds a NUL
    (read back exactly by :func:`_unescape_nul`); else ``arr`` untouched."""
    if arr.dtype != object or not any(isinstance(x, str) and "\x00" in x for x in arr.ravel()):
        return arr, False
    out = np.array([x.replace("\\", "\\\\").replace("\x00", "\\0") if isinstance(x, str) else x
                    for x in arr.ravel()], dtype=object).reshape(arr.shape)
    return out, True


def _unescape_nul(arr: np.ndarray) -> np.ndarray:
    def one(x):
        return re.sub(r"\\(\\|0)", lambda m: "\x00" if m[1] == "0" else "\\", x) if isinstance(x, str) else x

    return np.array([one(x) for x in arr.ravel()], dtype=object).reshape(arr.shape)


def _json_default(o: Any) -> Any:
    """numpy scalars and arrays as their Python values (not their str), anything else as its str."""
    if isinstance(o, (np.generic, np.ndarray)):
        return o.tolist()
    return str(o)


def subject(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The checkpoints a result is about: the sorted content fingerprints of every checkpoint description
    in its provenance (a mapping with ``path`` and ``fingerprint``, ``"blake3:<hex>"`` as
    ``weights.describe`` writes; or with ``sha256``, a single file's digest, as ``graftkit import`` records
    its source and older results their checkpoints, taken as ``"sha256:<hex>"``)."""
    found: set[str] = set()

    def walk(o: Any) -> None:
        if isinstance(o, Mapping):
            if "path" in o:
                if isinstance(o.get("fingerprint"), str):
                    found.add(o["fingerprint"])
                elif isinstance(o.get("sha256"), str):
                    found.add(f"sha256:{o['sha256']}")
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
    key = hashlib.sha256("\n".join(mine).encode()).hexdigest()[:8] if mine else "unkeyed"
    return with_tag(path, key)


def result_image(result: Result) -> bytes:
    """The bytes of ``result``'s HDF5 file, built in memory (h5py's core driver, no backing store): no
    byte reaches the disk until the whole image exists, so a full disk is one failed ``write`` of a file
    graftkit owns, never HDF5 closing a half-written file."""
    with h5py.File(f"graftkit-result-{os.getpid()}-{id(result)}.h5", "w", driver="core", backing_store=False) as f:
        f.attrs["kind"] = result.kind
        f.attrs["graftkit_version"] = __version__
        f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        f.attrs["attrs"] = json.dumps(result.attrs, default=_json_default)
        # netCDF-4: coordinate variables and arrays side by side in the root group (see the module docstring)
        scales = {}
        for dim, labels in result.coords.items():
            arr, escaped = _escape_nul(_as_h5(labels))
            ds = f.create_dataset(dim, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
            if escaped:
                ds.attrs[ESCAPED_NUL] = 1
            ds.make_scale(dim)
            scales[dim] = ds
        for name, (dims, values) in result.data.items():
            arr, escaped = _escape_nul(_as_h5(values))
            ds = f.create_dataset(name, data=arr, dtype=_STR if arr.dtype == object else arr.dtype)
            if escaped:
                ds.attrs[ESCAPED_NUL] = 1
            ds.attrs["attrs"] = json.dumps(dict(result.var_attrs.get(name, {})), default=_json_default)
            for i, d in enumerate(dims):
                ds.dims[i].label = d
                ds.dims[i].attach_scale(scales[d])
        f.flush()
        return f.id.get_file_image()


def write_result(path: str | os.PathLike, result: Result, flag: str | None = None) -> Path:
    """Write ``result`` atomically to ``path``, or — where ``path`` holds a result about other checkpoints —
    beside it (:func:`free_result_path`): an earlier result of another model is never replaced. Returns the
    path written. The file is built in memory (:func:`result_image`), its size checked against the free
    space, then written to a temporary sibling, fsynced, renamed and the folder fsynced
    (:func:`graftkit.core.files.write_atomic`, which also removes stale temporaries of dead processes there).
    ``flag``: the option that named ``path``, for errors."""
    check_file_dest(path, flag, result.kind + SUFFIX)
    path = free_result_path(path, result)
    return write_atomic(path, result_image(result), flag=flag, what=f"the {result.kind} result")


def _from_h5(ds: h5py.Dataset) -> np.ndarray:
    if h5py.check_string_dtype(ds.dtype) is not None:
        out = np.array(ds.asstr()[()], dtype=object)
        return _unescape_nul(out) if ds.attrs.get(ESCAPED_NUL) else out
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


class DamagedResult(GraftkitError):
    """A result file that cannot be read: truncated, not HDF5, garbled or missing attributes. ``reason``
    says which, in a few words (``graftkit results`` and ``graftkit report`` list it beside the file)."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: not a graftkit result file, or a damaged one ({reason})",
                         "rerun the command that wrote it, or remove the file")


_TRUNCATED = re.compile(r"truncated file: eof = (\d+).*stored_eof = (\d+)")


def damage_reason(path: Path, exc: BaseException) -> str:
    """Why the result file at ``path`` could not be read, in a few words."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, json.JSONDecodeError):
        return f"garbled attributes: not valid JSON ({exc.msg} at character {exc.pos})"
    if isinstance(exc, KeyError):
        return f"missing {exc.args[0] if exc.args else 'an entry'}: not a graftkit result or written incompletely"
    m = _TRUNCATED.search(text)
    if m:
        return f"truncated: {int(m[1]):,} of {int(m[2]):,} bytes"
    if "signature" in text:
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        return "empty file" if size == 0 else "not an HDF5 file"
    return f"unreadable ({type(exc).__name__}: {text})"


def read_result(path: str | os.PathLike) -> Result:
    """Load a result written by :func:`write_result` (this layout or the one before it). A file that cannot
    be read raises :class:`DamagedResult` (a :class:`GraftkitError`) saying why."""
    path = Path(path)
    if path.is_dir():
        raise GraftkitError(f"{path} is a folder, not a result file", "point at a .h5 written by graftkit")
    if not path.exists():
        raise GraftkitError(f"{path}: no such file, not a graftkit result", "check the path (graftkit results lists a run's results)")
    try:
        with h5py.File(path, "r") as f:
            coords, data, var_attrs = _read_arrays(f)
            attrs = json.loads(f.attrs["attrs"])
            if not isinstance(attrs, dict):
                raise ValueError("attrs is not a JSON object")
            attrs.setdefault("graftkit_version", f.attrs["graftkit_version"])
            attrs.setdefault("created", f.attrs["created"])
            return Result(str(f.attrs["kind"]), coords, data, attrs, var_attrs)
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:  # JSONDecodeError is a ValueError
        raise DamagedResult(path, damage_reason(path, exc)) from None


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
    """Every readable result file under ``run_dir``: path, kind and creation time, oldest first. Damaged
    files are not in it: :func:`scan_results` names them."""
    return [row for row, _ in scan_results(run_dir)[0]]


def scan_results(run_dir: str | os.PathLike) -> tuple[list[tuple[dict[str, str], Result]], list[DamagedResult]]:
    """Every result file under ``run_dir``, read: (row with path, kind and created, the result), oldest
    first; and every file that could not be read (:class:`DamagedResult`, path and reason), by path.
    Temporaries and partial results (hidden names) are not results."""
    found, damaged = [], []
    for p in result_files(run_dir):
        try:
            res = read_result(p)
            with h5py.File(p, "r") as f:
                created = str(f.attrs["created"])
        except DamagedResult as exc:
            damaged.append(exc)
            continue
        except (OSError, KeyError) as exc:  # changed since it was read
            damaged.append(DamagedResult(p, damage_reason(p, exc)))
            continue
        found.append(({"path": str(p), "kind": res.kind, "created": created}, res))
    return sorted(found, key=lambda x: x[0]["created"]), damaged


# ------------------------------------------------------------------------------------- graftkit clean


@dataclass(frozen=True, kw_only=True)
class CleanConfig(CommandConfig):
    """``graftkit clean``: list and remove the temporaries that killed graftkit processes left in a run."""

    command = "clean"
    run: Path | None = opt(None, argument=True)
    """Run folder, or any folder graftkit wrote into (default: the current run)."""
    dry_run: bool = False
    """List the stale temporaries; remove nothing."""


def run_clean(cfg: CleanConfig) -> dict[str, Any]:
    """Every stale temporary under the run (``.NAME.tmp-PID`` of a PID that no longer runs; see
    :mod:`graftkit.core.files`), removed unless ``dry_run``: folder, path, PID and bytes of each, and the total."""
    run = cfg.run or current_run()
    if not run.is_dir():
        raise GraftkitError(f"{run}: no such folder", "pass a run folder (e.g. runs/demo) or a folder graftkit wrote into")
    stale = find_stale(run)
    removed = [s for s in stale if cfg.dry_run or remove(s)]
    return {"run": str(run), "dry_run": cfg.dry_run,
            "stale": [{"path": str(s.path), "pid": s.pid, "bytes": s.nbytes} for s in removed],
            "bytes": sum(s.nbytes for s in removed)}
