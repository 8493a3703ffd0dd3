"""benchmarks/bench_cold_graft.py: verdicts on planted ratios (both outcomes), paired ratios on planted
times, the output check on planted folders, and one end-to-end run on a tiny pair."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_cold_graft",
                                                  ROOT / "benchmarks" / "bench_cold_graft.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_cold_graft"] = mod
    spec.loader.exec_module(mod)
    return mod


bc = _load()
TINY = bc.PairSpec(hidden=64, layers=2, vocab=256, intermediate=128, heads=4, kv_heads=2)


# ------------------------------------------------------------------------------------------ verdicts

def test_verdicts_all_met_on_planted_ratios():
    out = bc.verdicts({"cold/warm": 1.3, "cold/cp": 1.2, "warm/cp": 0.9})
    assert out == {"cold/warm": {"ratio": 1.3, "target": 1.3, "met": True},
                   "cold/cp": {"ratio": 1.2, "target": 1.5, "met": True},
                   "warm/cp": {"ratio": 0.9, "target": 1.0, "met": True}}


def test_verdicts_all_missed_on_planted_ratios():
    out = bc.verdicts({"cold/warm": 1.31, "cold/cp": 1.6, "warm/cp": 1.01})
    assert {k: v["met"] for k, v in out.items()} == {"cold/warm": False, "cold/cp": False, "warm/cp": False}
    assert out["cold/cp"]["target"] == 1.5


def test_verdicts_nan_misses_and_a_missing_ratio_is_refused():
    out = bc.verdicts({"cold/warm": float("nan"), "cold/cp": 1.0, "warm/cp": 1.0})
    assert out["cold/warm"]["met"] is False
    with pytest.raises(ValueError, match="warm/cp"):
        bc.verdicts({"cold/warm": 1.0, "cold/cp": 1.0})


# ------------------------------------------------------------------------------------ paired ratios

@dataclasses.dataclass
class _M:
    wall_s: float


def test_paired_ratios_on_planted_times():
    runs = {"graft cold": [_M(3.0), _M(5.0), _M(4.0)],
            "graft warm": [_M(2.0), _M(4.0), _M(1.0)],
            "cp": [_M(2.0), _M(2.0), _M(8.0)]}
    r = bc.paired_ratios(runs)
    assert r["cold/warm"]["paired"] == [1.5, 1.25, 4.0]
    assert r["cold/warm"]["median_paired"] == 1.5
    assert r["cold/warm"]["min_based"] == 3.0  # min 3 / min 1: not what the pairing gives
    assert r["cold/cp"]["paired"] == [1.5, 2.5, 0.5]
    assert r["cold/cp"]["median_paired"] == 1.5
    assert r["cold/cp"]["min_based"] == 1.5
    assert r["warm/cp"]["paired"] == [1.0, 2.0, 0.125]
    assert r["warm/cp"]["median_paired"] == 1.0
    assert r["warm/cp"]["min_based"] == 0.5


def test_paired_ratios_even_count_and_unequal_lengths():
    runs = {"graft cold": [_M(2.0), _M(6.0)], "graft warm": [_M(1.0), _M(2.0)], "cp": [_M(1.0), _M(1.0)]}
    assert bc.paired_ratios(runs)["cold/warm"]["median_paired"] == 2.5  # median of 2 and 3
    runs["cp"].append(_M(1.0))
    with pytest.raises(ValueError, match="same number"):
        bc.paired_ratios(runs)


# ------------------------------------------------------------------------------------ check_outputs

def _planted_output(folder: Path, fingerprints=("blake3:" + "a" * 64, "blake3:" + "b" * 64),
                    key: str = "fingerprint") -> Path:
    folder.mkdir(parents=True)
    (folder / "model-00001-of-00002.safetensors").write_bytes(bytes(range(256)) * 40)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\x07" * 5000)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}\n')
    (folder / "config.json").write_text("{}\n")
    parents = [{"role": "base", "path": "/p/base", key: fingerprints[0]},
               {"role": "rl", "path": "/p/rl", key: fingerprints[1]}]
    (folder / "graftkit.json").write_text(json.dumps({"created": str(folder), "parents": parents}))
    return folder


def test_check_outputs_identical_folders_have_no_problem(tmp_path):
    cold, warm = _planted_output(tmp_path / "cold"), _planted_output(tmp_path / "warm")
    assert bc.check_outputs(cold, warm) == []


def test_check_outputs_accepts_the_older_sha256_key(tmp_path):
    fps = ("a" * 64, "b" * 64)
    cold = _planted_output(tmp_path / "cold", fps, key="sha256")
    warm = _planted_output(tmp_path / "warm", fps, key="sha256")
    assert bc.check_outputs(cold, warm) == []


def test_check_outputs_names_one_differing_byte(tmp_path):
    cold, warm = _planted_output(tmp_path / "cold"), _planted_output(tmp_path / "warm")
    f = warm / "model-00001-of-00002.safetensors"
    data = bytearray(f.read_bytes())
    data[7777] ^= 0x01
    f.write_bytes(bytes(data))
    problems = bc.check_outputs(cold, warm)
    assert len(problems) == 1
    assert "model-00001-of-00002.safetensors" in problems[0]
    assert "from byte 7777" in problems[0]


def test_check_outputs_names_a_missing_weight_file(tmp_path):
    cold, warm = _planted_output(tmp_path / "cold"), _planted_output(tmp_path / "warm")
    (warm / "model-00002-of-00002.safetensors").unlink()
    problems = bc.check_outputs(cold, warm)
    assert len(problems) == 1 and "only in cold ['model-00002-of-00002.safetensors']" in problems[0]


def test_check_outputs_names_a_differing_parent_fingerprint(tmp_path):
    cold = _planted_output(tmp_path / "cold")
    warm = _planted_output(tmp_path / "warm", ("blake3:" + "a" * 64, "blake3:" + "c" * 64))
    problems = bc.check_outputs(cold, warm)
    assert len(problems) == 1
    assert "parent 'rl' fingerprint differs" in problems[0]
    assert "c" * 64 in problems[0] and "b" * 64 in problems[0]


def test_check_outputs_names_an_empty_fingerprint(tmp_path):
    cold = _planted_output(tmp_path / "cold", ("", "blake3:" + "b" * 64))
    warm = _planted_output(tmp_path / "warm", ("", "blake3:" + "b" * 64))
    problems = bc.check_outputs(cold, warm)
    assert len(problems) == 2
    assert all("no fingerprint for parent 'base'" in p for p in problems)


# ---------------------------------------------------------------------------------------- order

def test_rotation_gives_each_tool_each_place_and_never_one_tool_twice_in_a_row():
    tools = ["cp", "cold", "warm"]
    orders = [bc.rotation(tools, r) for r in range(6)]
    assert orders[:3] == [["cp", "cold", "warm"], ["cold", "warm", "cp"], ["warm", "cp", "cold"]]
    assert orders[3:] == orders[:3]
    for place in range(3):
        assert sorted(o[place] for o in orders[:3]) == sorted(tools)
    sequence = [t for o in orders for t in o]
    assert all(a != b for a, b in zip(sequence, sequence[1:]))


def test_run_tool_warms_inputs_then_evicts_its_output(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bc, "warm_page_cache", lambda paths: calls.append(("warm", list(paths))) or 0)
    monkeypatch.setattr(bc, "evict_page_cache", lambda paths: calls.append(("evict", list(paths))) or 0)
    src, out = tmp_path / "in.bin", tmp_path / "out"
    src.write_bytes(b"x" * 10)
    tool = bc.Tool("cp", ["bash", "-c", f'mkdir -p "{out}" && cp "{src}" "{out}/"'], out, None, (src,))
    m = bc.run_tool(tool, tmp_path / "scratch")
    assert m.wall_s > 0 and (out / "in.bin").read_bytes() == b"x" * 10
    assert calls == [("warm", [src]), ("evict", [out])]


def test_evict_page_cache_counts_bytes_and_leaves_files_intact(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1" * 4096)
    (tmp_path / "y.bin").write_bytes(b"2" * 100)
    n = bc.evict_page_cache([tmp_path / "a", tmp_path / "y.bin", tmp_path / "missing"])
    assert n == (4196 if hasattr(bc.os, "posix_fadvise") else 0)
    assert (tmp_path / "a" / "x.bin").read_bytes() == b"1" * 4096 and (tmp_path / "y.bin").read_bytes() == b"2" * 100


# ---------------------------------------------------------------------------------------- disk

def test_disk_needed_counts_the_pair_only_when_unwritten():
    one = int(TINY.model_bytes() * 1.02) + 64_000_000
    assert bc.disk_needed(TINY, pair_written=True) == 3 * one
    assert bc.disk_needed(TINY, pair_written=False) == 5 * one


def test_main_refuses_without_the_disk(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bc, "_free_bytes", lambda path: 1000)
    assert bc.main(["--repeats", "1", "--work", str(tmp_path / "work")], spec=TINY) == 2
    assert "not enough free disk" in capsys.readouterr().out
    assert not (tmp_path / "work").exists()


# ------------------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_main_end_to_end_on_a_tiny_pair(tmp_path, capsys):
    if not bc.GRAFTKIT_EXE.exists():
        pytest.skip(f"no graftkit executable at {bc.GRAFTKIT_EXE}")
    work = tmp_path / "work"
    assert bc.main(["--repeats", "1", "--work", str(work)], spec=TINY) == 0
    printed = capsys.readouterr().out
    record = json.loads((work / "cold_graft_results.json").read_text())
    assert record["benchmark"] == "cold_graft"
    assert record["spec"]["hidden"] == 64 and record["spec"]["layers"] == 2
    assert set(record["ratios"]) == {"cold/warm", "cold/cp", "warm/cp"}
    for r in record["ratios"].values():
        assert len(r["paired"]) == 1 and r["median_paired"] > 0 and r["min_based"] > 0
    for tool in ("cp", "graft cold", "graft warm"):
        wall = record["summaries"][tool]["wall_s"]
        assert wall["min"] > 0 and wall["values"] and all(v > 0 for v in wall["values"])
        assert record["summaries"][tool]["peak_rss_bytes"]["median"] > 0
    assert set(record["verdicts"]) == set(bc.TARGETS)
    assert record["checks"] == {"passed": True, "problems": []}
    disk = record["disk"]
    assert disk["needed_bytes"] > 0 and disk["free_bytes"] >= disk["needed_bytes"]
    assert "cold/warm" in printed and "byte-identical" in printed
    # outputs and caches are removed after a passing run; the pair stays for the next run
    assert not (work / "out-cold-graft").exists() and not (work / "caches-cold-graft").exists()
    assert (work / TINY.default_dir_name() / "base").is_dir()


@pytest.mark.slow
def test_check_outputs_on_real_graft_outputs_catches_a_changed_byte(tmp_path):
    """A real cold and warm output are identical; flipping one byte of a real shard is reported."""
    if not bc.GRAFTKIT_EXE.exists():
        pytest.skip(f"no graftkit executable at {bc.GRAFTKIT_EXE}")
    base, rl = bc.make_pair_from_spec(tmp_path / "pair", TINY, verbose=False)
    cache = tmp_path / "cache"
    for name, c in (("cold", tmp_path / "c1"), ("warm", cache), ("warm2", cache)):
        tool = bc.Tool(name, bc._graft_argv(bc.GRAFTKIT_EXE, base, rl, tmp_path / name), tmp_path / name, c)
        bc.run_tool(tool, tmp_path / "scratch")
    assert bc.check_outputs(tmp_path / "cold", tmp_path / "warm2") == []
    shutil.copytree(tmp_path / "warm2", tmp_path / "bad")
    shard = next((tmp_path / "bad").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = bc.check_outputs(tmp_path / "cold", tmp_path / "bad")
    assert problems == [f"weight file {shard.name}: cold and warm outputs differ from byte {len(data) - 1} "
                        f"(sizes {len(data)} and {len(data)})"]
