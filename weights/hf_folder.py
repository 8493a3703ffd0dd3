"""HF folders of safetensors and single ``.safetensors`` files, as checkpoints: the two readers of the format
graftkit writes.

An HF folder holds ``config.json`` and its weights as shards listed by ``model.safetensors.index.json`` (every tensor
the index lists must lie in the shard it names), as one ``model.safetensors``, or as other ``*.safetensors`` files (a
PEFT adapter's ``adapter_model.safetensors`` is none of them: :mod:`.lora`). Each file's header is read when the
folder is opened, so a truncated shard is an error before any tensor is read; a tensor is then read lazily with
``pread`` against the header's sizes (:mod:`.safetensors_file`).
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import GraftkitError
from .reader import PROVENANCE, Checkpoint, Found, Reader, TensorMeta, _read_json
from .safetensors_file import SafetensorsFile, TensorEntry

INDEX = "model.safetensors.index.json"


def _from_safetensors(path: Path, kind: str, files: list[Path], config: dict | None, stored: str) -> Checkpoint:
    opened = [SafetensorsFile(f) for f in files]
    entries: dict[str, TensorEntry] = {}
    by_name: dict[str, SafetensorsFile] = {}
    for sf in opened:
        for name, e in sf.entries.items():
            if name in entries:
                raise GraftkitError(
                    f"{path}: tensor {name} appears in both {entries[name].file.name} and {sf.path.name}",
                    "remove the stale shard",
                )
            entries[name], by_name[name] = e, sf
    metas = {n: TensorMeta(n, e.dtype, e.shape) for n, e in entries.items()}
    folder = path if path.is_dir() else path.parent
    prov = _read_json(folder / PROVENANCE) if (path.is_dir() and (folder / PROVENANCE).is_file()) else None
    return Checkpoint(path=path, kind=kind, metas=metas, reader=lambda n: by_name[n].read(n), raw=entries,
                      config=config, provenance=prov, weight_files=tuple(files), arrays=lambda n: by_name[n].array(n),
                      stored=stored)


def shards_from_index(folder: Path, index_name: str) -> list[Path]:
    index = _read_json(folder / index_name)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise GraftkitError(f"{folder / index_name}: no weight_map", "re-save the checkpoint")
    files = list(dict.fromkeys(weight_map.values()))
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise GraftkitError(
            f"{folder}: shard(s) listed in {index_name} are missing: {', '.join(missing)}",
            "download or copy the missing shards",
        )
    return [folder / f for f in files]


def _check_index(index_path: Path, ckpt: Checkpoint) -> None:
    """Every tensor the index lists must lie in the shard it names: a stale or partial shard would
    otherwise drop a tensor without a word."""
    for name, fname in _read_json(index_path)["weight_map"].items():
        entry = ckpt.raw.get(name)
        if entry is None or entry.file != index_path.parent / fname:
            found = f"it is in {entry.file.name}" if entry else "no shard holds it"
            raise GraftkitError(
                f"{index_path}: tensor {name} is listed in {fname} but {found}",
                "re-download or re-save the checkpoint",
            )


def _folder_files(path: Path) -> list[Path]:
    """The safetensors weight files of folder ``path`` that no index lists (``model.safetensors``, else every other
    ``*.safetensors`` but an adapter's)."""
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    return sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("adapter_model"))


def _recognise_folder(path: Path) -> Found | None:
    if path.is_dir() and ((path / INDEX).is_file() or _folder_files(path)):
        return Found(path, f"an HF folder ({path.name}/)")
    return None


def _open_folder(found: Found, path: Path) -> Checkpoint:
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else None
    if (path / INDEX).is_file():
        ckpt = _from_safetensors(path, "hf-folder", shards_from_index(path, INDEX), config, "safetensors files")
        _check_index(path / INDEX, ckpt)
        return ckpt
    return _from_safetensors(path, "hf-folder", _folder_files(path), config, "safetensors files")


def _recognise_file(path: Path) -> Found | None:
    return Found(path, "a safetensors file") if path.is_file() and path.suffix == ".safetensors" else None


def _open_file(found: Found, path: Path) -> Checkpoint:
    return _from_safetensors(path, "safetensors-file", [path], None, "a safetensors file")


#: An HF folder of safetensors weights.
FOLDER = Reader("hf-folder", _recognise_folder, _open_folder)
#: One ``.safetensors`` file (its config, where a command needs one, comes from the other side or ``--config``).
FILE = Reader("safetensors-file", _recognise_file, _open_file)

__all__ = ["FILE", "FOLDER", "INDEX", "shards_from_index"]
