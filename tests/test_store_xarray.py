"""Results as netCDF-4: every result kind graftkit writes opens with ``xarray.open_dataset(path,
engine="h5netcdf")`` with the values, dimensions and labels the typed read gives; files of the layout
before it still read; ``to_xarray`` / ``to_dataframe`` / ``open_result`` / ``open_run``."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

from graftkit.results.store import Result, open_result, open_run, read_result, write_result  # noqa: E402
from test_store import assert_same, sample  # noqa: E402

# --------------------------------------------------------------------------------- the comparison


def assert_xarray_matches(ds, res: Result) -> None:
    """``ds`` (read from disk by xarray) holds exactly ``res``'s arrays, dimensions, labels and attributes."""
    assert set(ds.data_vars) == set(res.data)
    assert dict(ds.sizes) == {d: len(v) for d, v in res.coords.items()}
    for d, labels in res.coords.items():
        assert d in ds.indexes and ds[d].dims == (d,), d
        got, want = ds[d].values, np.asarray(labels)
        assert got.tolist() == want.tolist(), d
        if want.dtype.kind in "iufb":
            assert got.dtype == want.dtype, d
    for name, (dims, values) in res.data.items():
        var, want = ds[name], np.asarray(values)
        assert var.dims == dims, name
        assert var.shape == want.shape, name
        if want.dtype.kind in "iufb":
            assert var.dtype == want.dtype, name
            np.testing.assert_array_equal(var.values, want)  # NaN == NaN here
        else:
            assert var.values.tolist() == want.tolist(), name
        assert json.loads(var.attrs["attrs"]) == dict(res.var_attrs.get(name, {})), name
    assert ds.attrs["kind"] == res.kind
    # the provenance: a JSON string, completed by the version and creation time as read_result does
    on_disk = json.loads(ds.attrs["attrs"])
    assert {"graftkit_version": ds.attrs["graftkit_version"], "created": ds.attrs["created"], **on_disk} == res.attrs


def check_file(path: Path) -> None:
    """The netCDF-4 reader and the typed reader agree on ``path``; so does :func:`open_result`."""
    res = read_result(path)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds.load()
        assert_xarray_matches(ds, res)
        mem = open_result(path)
        xr.testing.assert_equal(mem, ds)
        assert mem.attrs["kind"] == res.kind and mem.attrs["created"] == res.attrs["created"]
        for name in res.data:
            assert mem[name].attrs == dict(res.var_attrs.get(name, {}))


# --------------------------------------------------------------------------- every result kind


def _eval_kinds() -> dict[str, Result]:
    from graftkit.agent.evaluate import EvalOutcome
    from graftkit.agent.rollout import Decode
    from graftkit.evaluation.commands import EvalResult, HeadroomResult, eval_result

    rng = np.random.default_rng(0)
    tasks, seeds = ["click-button", "focus-text"], [0, 1, 2]

    def outcome(samples: int, greedy: bool) -> EvalOutcome:
        shape = (len(tasks), len(seeds), 2, samples)
        return EvalOutcome(tasks, seeds, 2, samples, Decode(greedy=greedy, temperature=0.7), rng.random(shape) < 0.5,
                           rng.random(shape), rng.integers(1, 5, shape).astype(np.int32),
                           rng.integers(0, 2, shape).astype(np.int32), 1.5)

    desc = {"path": "/ckpt/sft", "sha256": "ab" * 32}
    ev = eval_result(outcome(1, True), desc)
    head = HeadroomResult.from_outcomes(outcome(1, True), outcome(4, False), desc, k=4).to_result()
    assert isinstance(EvalResult.from_result(ev), EvalResult)
    return {"eval": ev, "headroom": head}


def _graft_kinds() -> dict[str, Result]:
    from graftkit.graft import attribution as A
    from graftkit.graft.experiments import dissociation_result, expand_sweep, subset_outcomes, sweep_result

    groups = ("attn", "mlp")
    exps = expand_sweep("factorial", groups, groups)
    rng = np.random.default_rng(1)
    sa = {e.label: (rng.random((2, 5, 3)) < 0.4 + 0.3 * ("attn" in e.groups)).astype(np.int8) for e in exps}
    sb = {e.label: (rng.random((2, 5, 3)) < 0.4 + 0.3 * ("mlp" in e.groups)).astype(np.int8) for e in exps}
    sweep = sweep_result("factorial", exps, sa, ["t1", "t2"], range(5), 3, groups, movement_share={"attn": 0.6},
                         attrs={"base": {"path": "/b"}, "rl": {"path": "/r"}}, n_boot=200)
    d = A.dissociation(subset_outcomes(exps, sa), subset_outcomes(exps, sb), groups, n_boot=200)
    dis = dissociation_result(d, {"A": {"path": "/x/a"}, "B": {"path": "/x/b"}})
    return {"graft-sweep": sweep, "graft-dissociation": dis}


def _coupling_kind() -> dict[str, Result]:
    from graftkit.rank.coupling import both_directions, coupling, coupling_result
    from graftkit.stats import BETTER, WORSE

    rng = np.random.default_rng(2)
    s, R = rng.random(6), rng.random((6, 3))
    c = coupling(R, s, n_boot=100, conventions={"metric": "erank"})
    b = both_directions(R, s, R[0], s[0], [BETTER, WORSE] * 3)
    return {"coupling": coupling_result(c, b)}


def _findings_kind() -> dict[str, Result]:
    from graftkit.study.findings import Finding, findings_result
    from graftkit.study.pipeline import StudyConfig

    found = [Finding(1, "claim one", "stated ‖Δ‖", -0.2, -0.3, -0.1, "not reproduced"),
             Finding(2, "claim two", "stated", float("nan"), float("nan"), float("nan"), "not measured")]
    return {"findings": findings_result(found, StudyConfig())}


def _training_kinds(root: Path) -> dict[str, Result]:
    from graftkit.train.commands import training_curves

    out = {}
    for kind, keys in (("sft", ("loss", "lr", "tokens")), ("grpo", ("loss", "reward", "clip_frac_low"))):
        folder = root / kind
        folder.mkdir()
        rows = [{"step": i + 1, **{k: 0.1 * (i + j) for j, k in enumerate(keys)}, "note": "x"} for i in range(5)]
        (folder / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "graftkit.json").write_text(json.dumps({"producer": f"test {kind}", "config": {"lr": 1e-3}}))
        out[f"train-{kind}"] = training_curves(folder, kind).to_result()
    return out


def _weight_kinds(root: Path) -> dict[str, Result]:
    from graftkit.graft import delta_anatomy
    from graftkit.rank import delta_ranks, weight_ranks
    from graftkit.weights import open_checkpoint
    from planted import planted_pair

    sft, rl = planted_pair(root / "pair")
    b, r = open_checkpoint(sft), open_checkpoint(rl)
    tax = b.taxonomy()
    return {"delta": delta_anatomy(b, [r], ["rl"], tax), "rank-weights": weight_ranks(b, tax, workers=1),
            "rank-delta": delta_ranks(b, r, tax)}


def _activations_kind() -> dict[str, Result]:
    from conftest import make_tiny_lm, make_tiny_tokenizer
    from graftkit.rank import activation_ranks

    prompts = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w10", "w11 w12 w13", "w14 w15 w16 w17 w18"]
    return {"rank-activations": activation_ranks(make_tiny_lm("qwen3"), make_tiny_tokenizer(), prompts, "all",
                                                 tokens="all")}


KINDS = ["eval", "headroom", "delta", "graft-sweep", "graft-dissociation", "rank-weights", "rank-delta",
         "rank-activations", "coupling", "train-sft", "train-grpo", "findings"]


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    built = {**_eval_kinds(), **_graft_kinds(), **_coupling_kind(), **_findings_kind(),
             **_training_kinds(root), **_weight_kinds(root), **_activations_kind()}
    assert sorted(built) == sorted(KINDS)
    return {kind: write_result(root / "results" / f"{kind}.h5", res) for kind, res in built.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_opens_with_xarray_as_the_typed_read(every_kind, kind):
    path = every_kind[kind]
    assert read_result(path).kind == kind
    check_file(path)


def test_open_run_opens_every_result(every_kind):
    run = next(iter(every_kind.values())).parent.parent
    opened = open_run(run)
    assert sorted(opened) == sorted(KINDS)  # keyed by file stem
    for kind, ds in opened.items():
        assert ds.attrs["kind"] == kind
        xr.testing.assert_equal(ds, read_result(every_kind[kind]).to_xarray())


def test_open_run_keys_files_that_share_a_stem_by_their_path(tmp_path):
    write_result(tmp_path / "results" / "delta.h5", sample("delta"))
    write_result(tmp_path / "results" / "sub" / "delta.h5", sample("other"))
    write_result(tmp_path / "results" / "eval.h5", sample("eval"))
    opened = open_run(tmp_path)
    assert set(opened) == {"results/delta", "results/sub/delta", "eval"}
    assert opened["results/sub/delta"].attrs["kind"] == "other"
    assert open_run(tmp_path / "missing") == {}


def test_netcdf_layout_and_what_h5netcdf_needs(tmp_path):
    """Coordinate variables and arrays in the root group, nothing netCDF-C-specific: no ``_Netcdf4Dimid``,
    ``_Netcdf4Coordinates`` or ``_NCProperties`` (h5netcdf names a dimension after its scale dataset)."""
    res = sample()
    path = write_result(tmp_path / "r.h5", res)
    with h5py.File(path, "r") as f:
        assert set(f) == set(res.coords) | set(res.data)
        assert "_NCProperties" not in f.attrs
        for obj in f.values():
            assert not {"_Netcdf4Dimid", "_Netcdf4Coordinates"} & set(obj.attrs)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds.load()
        assert_xarray_matches(ds, read_result(path))
        assert ds["flag"].dtype == bool  # h5py's bool (an HDF5 enum) reads as bool
        assert ds["run"].values.tolist() == ["rl", "rl-2 ‖Δ‖"]  # variable-length UTF-8


def test_a_dimension_without_a_scale_is_not_a_netcdf_dimension(tmp_path):
    """Why every dimension has a coordinate variable: an axis with no scale attached has no name for
    netCDF-4 (h5netcdf raises or, in newer xarray, invents ``phony_dim_N``)."""
    with h5py.File(tmp_path / "bare.h5", "w") as f:
        f["v"] = np.zeros(3)
    with xr.open_dataset(tmp_path / "bare.h5", engine="h5netcdf", phony_dims="sort") as ds:
        assert ds["v"].dims == ("phony_dim_0",)


def test_empty_dimensions_and_scalars_open(tmp_path):
    res = Result("x", {"layer": np.arange(0), "name": np.array([], dtype=object), "k": np.array([2, 3])},
                 {"v": (("layer",), np.zeros(0)), "w": (("name", "layer"), np.zeros((0, 0))),
                  "s": ((), np.float64(2.5)), "n": (("k",), np.array([0, 7], dtype=np.uint16))})
    path = write_result(tmp_path / "e.h5", res)
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds.load()
        assert_xarray_matches(ds, read_result(path))
        assert float(ds["s"]) == 2.5 and ds["n"].values.tolist() == [0, 7]  # no fill value masks a 0
    assert_same(read_result(path), res)


def test_an_array_named_after_a_dimension_is_refused():
    with pytest.raises(ValueError, match="named after a dimension"):
        Result("x", {"layer": np.arange(3)}, {"layer": (("layer",), np.zeros(3))})
    with pytest.raises(ValueError, match="rename the array, e.g. group_value"):
        Result("x", {"tensor": np.arange(3), "group": np.arange(2)}, {"group": (("tensor",), np.zeros(3))})


def test_every_kind_has_no_array_named_after_a_dimension(every_kind):
    for kind, path in every_kind.items():
        res = read_result(path)
        assert not set(res.data) & set(res.coords), kind


# --------------------------------------------------------------------------- the layout before


def write_old_layout(path: Path, res: Result) -> None:
    """A result as graftkit wrote it before the netCDF-4 layout: ``/coords/<dim>`` scales attached to
    ``/data/<name>`` in sibling groups, each array's dimensions in a JSON ``dims`` attribute."""
    string = h5py.string_dtype("utf-8")

    def h5(values):
        arr = np.asarray(values)
        return arr.astype(object) if arr.dtype.kind in ("U", "O") else arr

    with h5py.File(path, "w") as f:
        f.attrs["kind"] = res.kind
        f.attrs["graftkit_version"] = "0.0.1-old"
        f.attrs["created"] = "2025-01-01T00:00:00+00:00"
        f.attrs["attrs"] = json.dumps(res.attrs)
        cg, dg = f.create_group("coords"), f.create_group("data")
        scales = {}
        for dim, labels in res.coords.items():
            arr = h5(labels)
            ds = cg.create_dataset(dim, data=arr, dtype=string if arr.dtype == object else arr.dtype)
            ds.make_scale(dim)
            scales[dim] = ds
        for name, (dims, values) in res.data.items():
            arr = h5(values)
            ds = dg.create_dataset(name, data=arr, dtype=string if arr.dtype == object else arr.dtype)
            ds.attrs["dims"] = json.dumps(list(dims))
            ds.attrs["attrs"] = json.dumps(dict(res.var_attrs.get(name, {})))
            for i, d in enumerate(dims):
                ds.dims[i].label = d
                ds.dims[i].attach_scale(scales[d])


def test_old_layout_files_still_read(tmp_path):
    res = sample()
    path = tmp_path / "old.h5"
    write_old_layout(path, res)
    back = read_result(path)
    assert_same(res, back)
    assert {k: back.attrs[k] for k in res.attrs} == dict(res.attrs)
    assert back.attrs["graftkit_version"] == "0.0.1-old" and back.attrs["created"] == "2025-01-01T00:00:00+00:00"
    assert back.var_attrs["fro"] == {"unit": "‖Δ‖_F", "dtype": "float32"} and back.var_attrs["count"] == {}
    assert back["cube"].dtype == np.float32 and back["flag"].dtype == bool
    # the typed read is the way into xarray for them: open_result / open_run
    ds = open_result(path)
    assert set(ds.data_vars) == set(res.data) and ds["cube"].dims == ("run", "layer", "alpha")
    assert ds["fro"].sel(tensor="lm_head.weight", run="rl").item() == res["fro"][0, 2]
    assert set(open_run(tmp_path)) == {"old"}
    # rewritten, it becomes the netCDF-4 layout with the same content
    new = write_result(tmp_path / "new.h5", back)
    assert_same(read_result(new), res)
    check_file(new)


def test_old_layout_of_every_kind_reads_as_the_new(every_kind, tmp_path):
    for kind, path in every_kind.items():
        res = read_result(path)
        old = tmp_path / f"{kind}.h5"
        write_old_layout(old, res)
        assert_same(read_result(old), res)
        assert read_result(old).var_attrs == res.var_attrs


# ----------------------------------------------------------------------- to_xarray, to_dataframe


def test_to_xarray_labels_values_and_decoded_attrs():
    res = sample()
    ds = res.to_xarray()
    assert set(ds.data_vars) == set(res.data) and dict(ds.sizes) == {d: len(v) for d, v in res.coords.items()}
    for name in res.data:
        assert ds[name].dims == res.dims(name)
        np.testing.assert_array_equal(ds[name].values, res[name])
        assert ds[name].dtype == np.asarray(res[name]).dtype
    assert ds["fro"].attrs == {"unit": "‖Δ‖_F", "dtype": "float32"}
    assert ds.attrs["config"] == {"groups": ["attn", "mlp"]} and ds.attrs["kind"] == "sample"
    assert ds["cube"].sel(run="rl-2 ‖Δ‖", layer=3, alpha=0.5).item() == res["cube"][1, 3, 1]


def test_view_to_xarray_delegates(every_kind):
    from graftkit.study.findings import FindingsResult

    view = FindingsResult.read(every_kind["findings"])
    xr.testing.assert_identical(view.to_xarray(), view.result.to_xarray())
    assert view.to_xarray()["verdict"].sel(finding="2").item() == "not measured"


def test_to_dataframe_round_trips_every_array():
    res = sample()
    for name, (dims, values) in res.data.items():
        df = res.to_dataframe(name)
        values = np.asarray(values)
        assert list(df.columns) == [*dims, "value"] and len(df) == values.size
        for row, idx in zip(df.itertuples(index=False), itertools.product(*(range(n) for n in values.shape))):
            assert [row[k] for k in range(len(dims))] == [res.coords[d][i] for d, i in zip(dims, idx)]
            assert row[-1] == values[idx]
        # back to the array: pivot on the labels in the coordinates' order
        back = df.set_index(list(dims))["value"].to_xarray().transpose(*dims)
        for d in dims:
            back = back.reindex({d: res.coords[d]})
        np.testing.assert_array_equal(back.values.astype(values.dtype), values)
        if values.dtype.kind in "iufb":
            assert df["value"].dtype == values.dtype


def test_to_dataframe_agrees_with_the_csv_tables(every_kind):
    from graftkit.figures.tables import tidy_rows

    res = read_result(every_kind["delta"])
    for name in ("share", "tensor_group", "total_cosine"):
        header, rows = tidy_rows(res, name)
        df = res.to_dataframe(name)
        assert list(df.columns) == header
        for want, got in zip(rows, df.itertuples(index=False)):
            assert list(got[:-1]) == want[:-1]
            assert (float(want[-1]) == got[-1] or np.isnan(got[-1])) if isinstance(got[-1], float) else \
                got[-1] == want[-1]


def test_to_dataframe_of_a_scalar_and_of_a_dimension_called_value():
    res = Result("x", {"value": np.array([1, 2])}, {"s": ((), np.float64(4.0)), "w": (("value",), np.array([5, 6]))})
    assert res.to_dataframe("s").to_dict("list") == {"value": [4.0]}
    assert res.to_dataframe("w").to_dict("list") == {"value": [1, 2], "w": [5, 6]}


def test_graftkit_import_does_not_import_xarray_or_pandas():
    code = "import sys, graftkit, graftkit.results.store; print(sorted({'xarray', 'pandas', 'h5netcdf'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_xarray_says_which_extra(monkeypatch):
    from graftkit.core.errors import GraftkitError

    monkeypatch.setitem(sys.modules, "xarray", None)  # import fails
    with pytest.raises(GraftkitError, match="xarray is not installed") as e:
        sample().to_xarray()
    assert e.value.fix == "pip install 'graftkit[xarray]'"
