"""HDF5 results: labelled arrays with provenance, written atomically, readable by plain h5py."""

from __future__ import annotations

import datetime
import json
import os
import types
from pathlib import Path

import h5py
import numpy as np
import pytest

from graftkit.results import store
from graftkit._version import __version__
from graftkit.core.errors import GraftkitError
from graftkit.results.store import Result, list_results, read_result, write_result


def sample(kind: str = "sample", scale: float = 1.0) -> Result:
    rng = np.random.default_rng(0)
    coords = {
        "run": np.array(["rl", "rl-2 ‖Δ‖"], dtype=object),
        "tensor": np.array(["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"]),
        "layer": np.arange(4),
        "alpha": np.array([0.0, 0.5, 1.0]),
    }
    data = {
        "fro": (("run", "tensor"), scale * rng.random((2, 3))),
        "count": (("tensor",), np.array([3, 0, 7], dtype=np.int64)),
        "cube": (("run", "layer", "alpha"), rng.random((2, 4, 3)).astype(np.float32)),
        "group": (("tensor",), np.array(["embed", "mlp", "lm_head"], dtype=object)),
        "flag": (("layer",), np.array([True, False, True, True])),
    }
    attrs = {"tol": 1e-5, "family": "llama", "tied": False, "n": 3, "config": {"groups": ["attn", "mlp"]},
             "note": "‖Δ‖_F / ‖W‖_F"}
    var_attrs = {"fro": {"unit": "‖Δ‖_F", "dtype": "float32"}}
    return Result(kind, coords, data, attrs, var_attrs)


def assert_same(a: Result, b: Result) -> None:
    assert a.kind == b.kind
    assert set(a.coords) == set(b.coords)
    for k in a.coords:
        assert list(a.coords[k]) == list(b.coords[k]), k
    assert set(a.data) == set(b.data)
    for k in a.data:
        assert a.dims(k) == b.dims(k), k
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.shape == y.shape, k
        if x.dtype.kind in "fiub":
            assert x.dtype == y.dtype, k
            np.testing.assert_array_equal(x, y)
        else:
            assert x.tolist() == y.tolist(), k


def test_round_trip(tmp_path):
    res = sample()
    path = write_result(tmp_path / "sub" / "r.h5", res)
    assert path == tmp_path / "sub" / "r.h5" and path.is_file()
    back = read_result(path)
    assert_same(res, back)
    for k, v in res.attrs.items():
        assert back.attrs[k] == v, k
    assert back.attrs["graftkit_version"] == __version__
    assert back.attrs["created"]
    assert back.var_attrs["fro"] == {"unit": "‖Δ‖_F", "dtype": "float32"}
    assert back.var_attrs["count"] == {}
    assert back["count"].dtype == np.int64 and back["cube"].dtype == np.float32
    assert isinstance(back.coords["run"][1], str) and back.coords["run"][1] == "rl-2 ‖Δ‖"


def test_numpy_scalars_in_attrs_keep_their_type(tmp_path):
    res = Result("x", {"a": np.arange(2)}, {"v": (("a",), np.zeros(2))},
                 {"n": np.int64(3), "x": np.float32(0.5), "ok": np.bool_(True), "arr": np.arange(3)})
    back = read_result(write_result(tmp_path / "x.h5", res))
    assert back.attrs["n"] == 3 and isinstance(back.attrs["n"], int)
    assert back.attrs["x"] == 0.5 and back.attrs["ok"] is True and back.attrs["arr"] == [0, 1, 2]


def test_empty_dimension_round_trips(tmp_path):
    res = Result("x", {"layer": np.arange(0), "name": np.array([], dtype=object)},
                 {"v": (("layer",), np.zeros(0)), "w": (("name", "layer"), np.zeros((0, 0)))})
    back = read_result(write_result(tmp_path / "e.h5", res))
    assert back["v"].shape == (0,) and back["w"].shape == (0, 0) and list(back.coords["name"]) == []


def test_dimension_labels_and_scales_visible_to_h5py(tmp_path):
    # the netCDF-4 layout: coordinate variables (dimension scales named after their dimension) and the
    # arrays side by side in the root group
    res = sample()
    path = write_result(tmp_path / "r.h5", res)
    with h5py.File(path, "r") as f:
        assert f.attrs["kind"] == "sample"
        assert json.loads(f.attrs["attrs"])["family"] == "llama"
        assert set(f) == set(res.coords) | set(res.data)
        for d in res.coords:
            assert h5py.h5ds.is_scale(f[d].id)
        for name, (dims, values) in res.data.items():
            ds = f[name]
            assert ds.shape == np.shape(values)
            assert not h5py.h5ds.is_scale(ds.id)
            assert len(ds.dims) == len(dims)
            for i, d in enumerate(dims):
                assert ds.dims[i].label == d
                assert len(ds.dims[i]) == 1
                scale = ds.dims[i][0]
                assert scale.name == f"/{d}"
                assert h5py.h5ds.is_scale(scale.id)
                got = scale.asstr()[()] if h5py.check_string_dtype(scale.dtype) else scale[()]
                assert list(got) == list(res.coords[d])
        assert f["fro"].dims[1][0].asstr()[()].tolist()[0] == "model.embed_tokens.weight"
        assert h5py.check_string_dtype(f["group"].dtype).encoding == "utf-8"
        assert json.loads(f["fro"].attrs["attrs"]) == {"unit": "‖Δ‖_F", "dtype": "float32"}


def test_failed_write_leaves_nothing_and_keeps_an_existing_result(tmp_path, monkeypatch):
    path = tmp_path / "r.h5"
    write_result(path, sample(scale=1.0))
    before = path.read_bytes()

    # a value h5py cannot store fails half-way through the file
    bad = Result("x", {"a": np.arange(2)},
                 {"ok": (("a",), np.zeros(2)), "bad": (("a",), np.array([{"k": 1}, None], dtype=object))})
    with pytest.raises(Exception):
        write_result(path, bad)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]

    # a crash at the very end (the rename) changes nothing either
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_result(path, sample(scale=2.0))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]
    assert_same(read_result(path), sample(scale=1.0))

    # and a failure for a new file leaves no file at all
    with pytest.raises(Exception):
        write_result(tmp_path / "new.h5", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]


def test_interrupt_during_write_leaves_nothing(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = h5py.Group.create_dataset

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(h5py.Group, "create_dataset", flaky)
    with pytest.raises(KeyboardInterrupt):
        write_result(tmp_path / "r.h5", sample())
    assert list(tmp_path.iterdir()) == []


def test_list_results(tmp_path):
    run = tmp_path / "run"
    write_result(run / "results" / "delta-a.h5", sample("delta"))
    write_result(run / "results" / "sub" / "graft.h5", sample("graft"))
    (run / "results" / "notes.h5").write_bytes(b"not hdf5")  # skipped: not a result
    with h5py.File(run / "foreign.h5", "w") as f:  # skipped: HDF5 but not ours
        f["x"] = 1
    write_result(run / "results" / ".hidden.h5", sample("hidden"))  # skipped: hidden (a temp name)
    found = list_results(run)
    assert sorted((Path(r["path"]).name, r["kind"]) for r in found) == [("delta-a.h5", "delta"), ("graft.h5", "graft")]
    assert all(set(r) == {"path", "kind", "created"} for r in found)
    assert [r["created"] for r in found] == sorted(r["created"] for r in found)
    assert list_results(tmp_path / "missing") == []


def test_list_results_oldest_first(tmp_path, monkeypatch):
    # Creation stamps have one-second resolution: a clock that moves a minute per reading orders the two writes
    # without waiting for the wall clock.
    readings = iter(range(60))

    class Clock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2025, 1, 1, tzinfo=tz) + datetime.timedelta(minutes=next(readings))

    monkeypatch.setattr(store, "_dt", types.SimpleNamespace(datetime=Clock, timezone=datetime.timezone))
    write_result(tmp_path / "b.h5", sample("first"))
    write_result(tmp_path / "a.h5", sample("second"))
    assert [r["kind"] for r in list_results(tmp_path)] == ["first", "second"]


@pytest.mark.parametrize(
    "coords, data, match",
    [
        ({"a": np.arange(3)}, {"v": (("a", "b"), np.zeros(3))}, "2 dims for a 1-d array"),
        ({"a": np.arange(3)}, {"v": (("b",), np.zeros(3))}, "dimension b has no coordinate"),
        ({"a": np.arange(2)}, {"v": (("a",), np.zeros(3))}, "dimension a has 2 labels, array has 3"),
        ({"a": np.arange(3), "b": np.arange(2)}, {"v": (("a", "b"), np.zeros((3, 3)))}, "dimension b has 2 labels"),
    ],
)
def test_result_validation(coords, data, match):
    with pytest.raises(ValueError, match=match):
        Result("x", coords, data)


def test_result_accessors():
    res = sample()
    assert res.dims("cube") == ("run", "layer", "alpha")
    assert res["count"].tolist() == [3, 0, 7]
    with pytest.raises(KeyError):
        res["missing"]


def test_read_result_of_a_non_result_is_one_line_error(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"garbage")
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f["x"] = 1
    for p in (tmp_path / "x.h5", tmp_path / "y.h5", tmp_path / "missing.h5"):
        with pytest.raises(GraftkitError, match="not a graftkit result") as e:
            read_result(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_no_temporary_file_is_left_after_success(tmp_path):
    write_result(tmp_path / "r.h5", sample())
    write_result(tmp_path / "r.h5", sample(scale=3.0))  # replaces
    assert os.listdir(tmp_path) == ["r.h5"]
    np.testing.assert_array_equal(read_result(tmp_path / "r.h5")["fro"], sample(scale=3.0)["fro"])


def test_strings_holding_a_nul_are_stored_and_read_back_exactly(tmp_path):
    """A decoded token of a byte-level tokenizer can be a NUL, which HDF5's variable-length strings cannot hold."""
    texts = np.array(["a\x00b", "back\\slash", "\\0 literal", "\x00", "plain"], dtype=object)
    res = Result("demo", {"token": texts}, {"text": (("token",), texts.copy())})
    path = write_result(tmp_path / "r.h5", res)
    back = read_result(path)
    assert list(back.coords["token"]) == list(texts) and list(back["text"]) == list(texts)
    plain = Result("demo", {"token": np.array(["x", "y"], dtype=object)}, {})
    assert list(read_result(write_result(tmp_path / "p.h5", plain)).coords["token"]) == ["x", "y"]
