"""Fault injection: what the operating system throws, from every command that writes or reads checkpoints.

Each fault runs the command line in a subprocess (``python -m graftkit``) and ends in one line on stderr,
exit status 2 and no traceback; the inputs are byte-identical afterwards, nothing is half-written and no
temporary is left. Faults: a full disk (a 64 KiB tmpfs with ~20 KiB free), a read-only file system (a
read-only bind mount: chmod does not stop root), destinations of the wrong kind, an input that shrinks
while it is read, damaged result files, and temporaries left by a killed process. Mount-based tests need
root (CAP_SYS_ADMIN) and skip cleanly elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

from graftkit.core import files  # noqa: E402
from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.results.store import DamagedResult, Result, read_result, scan_results, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------- helpers


def gk(*args, cwd: Path, script: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m graftkit ARGS`` (or ``python SCRIPT... ARGS``) with runs under ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GRAFTKIT_RUNS": str(cwd / "runs"),
           "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    cmd = [sys.executable, *(script or ["-m", "graftkit"]), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The command failed as a fault must: exit 2, one line on stderr naming what it should, no traceback."""
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("removed ")]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def tree_hash(*roots: Path) -> dict[str, str]:
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def temps(*roots: Path) -> list[str]:
    return [str(p) for root in roots for p in Path(root).rglob("*") if files.TEMP.fullmatch(p.name)]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _mount(*args) -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs with about 20 KiB free."""
    where = tmp_path / "full"
    where.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        (where / "filler").write_bytes(b"\0" * (44 << 10))
        assert 16 << 10 <= files.free_bytes(where) <= 24 << 10
        (where / "filler.sha").write_text("x")
        yield where
    finally:
        _umount(where)


@pytest.fixture
def read_only(tmp_path):
    """A folder that a read-only bind mount makes unwritable, for root too."""
    src, where = tmp_path / "ro-src", tmp_path / "ro"
    src.mkdir()
    where.mkdir()
    (src / "existing.txt").write_text("keep\n")
    if not _mount("--bind", "-o", "ro", str(src), str(where)):
        pytest.skip("a read-only bind mount needs root (CAP_SYS_ADMIN)")
    try:
        probe = where / "probe"
        try:
            probe.write_text("x")
            probe.unlink()
            pytest.skip("the bind mount did not come up read-only here")
        except OSError:
            pass
        yield where
    finally:
        _umount(where)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return P.make_pair(tmp_path_factory.mktemp("faults") / "pair", "qwen3", layers=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory, pair):
    """A run folder holding one delta result (written through the command line)."""
    root = tmp_path_factory.mktemp("faults-run")
    proc = gk("delta", "--base", pair.base, "--from", pair.rl, "--run", root / "run", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root / "run"


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A tiny untrained policy over the task vocabulary: a valid --init for `train grpo`."""
    from graftkit.agent import task_words, tiny_policy
    from graftkit.weights import save_model

    p = tiny_policy(task_words(), "nano")
    return save_model(tmp_path_factory.mktemp("policy") / "sft", p.model, p.tokenizer, provenance={"producer": "tests"})


GRPO = ("--tasks", "click-button", "--steps", "2", "--prompts-per-step", "1", "--group-size", "2",
        "--max-new-tokens", "8", "--threads", "1")


# -------------------------------------------------------------------------------------- a full disk


@pytest.mark.slow
def test_full_disk_delta_never_crashes_three_times(pair, full_disk, tmp_path):
    before = tree_hash(pair.base, pair.rl)
    for _ in range(3):
        proc = gk("delta", "--base", pair.base, "--from", pair.rl, "--save", full_disk / "delta.h5", cwd=tmp_path)
        one_line_exit_2(proc, str(full_disk / "delta.h5"), "free")
    assert tree_hash(pair.base, pair.rl) == before
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "filler.sha"]


def test_result_writer_on_a_full_disk_is_one_error_even_past_the_space_check(full_disk, monkeypatch):
    """The HDF5 image is built in memory, so the disk filling up during the write is a failed os.write of a
    temporary graftkit owns (removed), never HDF5 closing a half-written file."""
    monkeypatch.setattr(files, "check_space", lambda *a, **k: None)
    big = Result("x", {"i": np.arange(8192)}, {"v": (("i",), np.random.default_rng(0).random(8192))})
    with pytest.raises(GraftkitError, match="no space left on the device") as e:
        write_result(full_disk / "r.h5", big)
    assert "\n" not in str(e.value) and str(full_disk / "r.h5") in str(e.value)
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "filler.sha"]


def test_full_disk_graft_export_is_refused_before_it_writes(pair, full_disk, tmp_path):
    before = tree_hash(pair.base, pair.rl)
    proc = gk("graft", "--from", pair.rl, "--base", pair.base, "--groups", "attn,mlp", "--out", full_disk / "g",
              cwd=tmp_path)
    one_line_exit_2(proc, "not enough free space", str(full_disk / "g"), "--out")
    assert tree_hash(pair.base, pair.rl) == before
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "filler.sha"]


def test_full_disk_report(run, full_disk, tmp_path):
    before = tree_hash(run)
    one_line_exit_2(gk("report", run, "--out", full_disk / "report.html", cwd=tmp_path), "--out", "free")
    assert tree_hash(run) == before and temps(run, full_disk) == []
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "filler.sha"]


@pytest.mark.slow
def test_full_disk_train_grpo_is_refused_before_training(policy, full_disk, tmp_path):
    before = tree_hash(policy)
    proc = gk("train", "grpo", "--init", policy, "--out", full_disk / "rl", "--run", tmp_path / "r", *GRPO, cwd=tmp_path)
    one_line_exit_2(proc, "not enough free space", "--out")
    assert tree_hash(policy) == before
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "filler.sha"]


# ---------------------------------------------------------------------------- a read-only file system


def test_read_only_delta(pair, read_only, tmp_path):
    before = tree_hash(pair.base, pair.rl)
    proc = gk("delta", "--base", pair.base, "--from", pair.rl, "--save", read_only / "delta.h5", cwd=tmp_path)
    one_line_exit_2(proc, "read-only", str(read_only / "delta.h5"))
    assert tree_hash(pair.base, pair.rl) == before
    assert sorted(p.name for p in read_only.iterdir()) == ["existing.txt"]


def test_read_only_graft(pair, read_only, tmp_path):
    before = tree_hash(pair.base, pair.rl)
    proc = gk("graft", "--from", pair.rl, "--base", pair.base, "--groups", "attn", "--out", read_only / "g",
              cwd=tmp_path)
    one_line_exit_2(proc, "read-only", "--out")
    assert tree_hash(pair.base, pair.rl) == before
    assert sorted(p.name for p in read_only.iterdir()) == ["existing.txt"]


def test_read_only_report(run, read_only, tmp_path):
    one_line_exit_2(gk("report", run, "--out", read_only / "report.html", cwd=tmp_path), "read-only", "--out")
    assert sorted(p.name for p in read_only.iterdir()) == ["existing.txt"]


@pytest.mark.slow
def test_read_only_train_grpo_fails_before_training(policy, read_only, tmp_path):
    proc = gk("train", "grpo", "--init", policy, "--out", read_only / "rl", "--run", tmp_path / "r", *GRPO,
              cwd=tmp_path)
    one_line_exit_2(proc, "read-only", "--out")
    assert not (tmp_path / "r").exists()  # no training curves: it never trained
    assert sorted(p.name for p in read_only.iterdir()) == ["existing.txt"]


# ------------------------------------------------------------------------------ paths of the wrong kind


def test_delta_save_into_a_folder(pair, tmp_path):
    (tmp_path / "dir").mkdir()
    before = tree_hash(pair.base, pair.rl)
    one_line_exit_2(gk("delta", "--base", pair.base, "--from", pair.rl, "--save", tmp_path / "dir", cwd=tmp_path),
                    "is a folder, not a file")
    assert list((tmp_path / "dir").iterdir()) == [] and temps(tmp_path) == []
    assert tree_hash(pair.base, pair.rl) == before


@pytest.mark.parametrize("command", [("delta",), ("rank", "--what", "delta")], ids=["delta", "rank"])
def test_a_save_onto_a_folder_names_the_flag(pair, tmp_path, command):
    (tmp_path / "dir").mkdir()
    args = ("--from", pair.rl, "--base", pair.base) if command == ("delta",) else ("--model", pair.rl, "--base", pair.base)
    one_line_exit_2(gk(*command, *args, "--save", tmp_path / "dir", cwd=tmp_path), "--save", "is a folder, not a file")
    assert list((tmp_path / "dir").iterdir()) == [] and temps(tmp_path) == []


def test_report_out_is_a_folder(run, tmp_path):
    (tmp_path / "dir").mkdir()
    one_line_exit_2(gk("report", run, "--out", tmp_path / "dir", cwd=tmp_path), "--out", "is a folder, not a file")
    assert list((tmp_path / "dir").iterdir()) == []


def test_graft_out_below_a_file_and_onto_a_file(pair, tmp_path):
    (tmp_path / "file").write_text("x")
    args = ("graft", "--from", pair.rl, "--base", pair.base, "--groups", "attn")
    one_line_exit_2(gk(*args, "--out", tmp_path / "file" / "sub", cwd=tmp_path), "is a file, not a folder")
    line = one_line_exit_2(gk(*args, "--out", tmp_path / "file", cwd=tmp_path), "is a file, not a folder")
    assert "folder" not in line.split("is a file")[0]  # the file is not called a folder
    assert (tmp_path / "file").read_text() == "x" and temps(tmp_path) == []


def test_results_csv_onto_a_file(run, tmp_path):
    (tmp_path / "file").write_text("x")
    one_line_exit_2(gk("results", run, "--csv", tmp_path / "file", cwd=tmp_path), "--csv", "is a file, not a folder")
    assert (tmp_path / "file").read_text() == "x"


# ---------------------------------------------------------------------- an input that shrinks while read


@pytest.mark.parametrize("command", ["delta", "graft"])
def test_shard_truncated_while_read_is_one_line_not_sigbus(pair, tmp_path, command):
    rl = tmp_path / "rl"
    shutil.copytree(pair.rl, rl)
    shard = rl / "model.safetensors"
    size = shard.stat().st_size
    before = tree_hash(pair.base)
    args = {"delta": ("delta", "--base", pair.base, "--from", rl, "--save", tmp_path / "d.h5"),
            "graft": ("graft", "--from", rl, "--base", pair.base, "--groups", "attn,mlp", "--out", tmp_path / "g")}
    proc = gk(*args[command], cwd=tmp_path, script=[str(HERE / "fault_shrink.py"), str(shard)])
    one_line_exit_2(proc, str(shard), f"{size // 2:,} bytes now", "changed while it was read", "rerun when it is complete")
    assert shard.stat().st_size == size // 2  # the fault happened
    assert tree_hash(pair.base) == before
    assert not (tmp_path / "d.h5").exists() and not (tmp_path / "g").exists() and temps(tmp_path) == []


def test_in_place_read_of_a_shrunk_file_names_it(pair, tmp_path):
    from graftkit.weights import open_checkpoint

    rl = tmp_path / "rl"
    shutil.copytree(pair.rl, rl)
    ck = open_checkpoint(rl)
    name = max(ck.raw, key=lambda n: ck.raw[n].end)
    os.truncate(rl / "model.safetensors", ck.raw[name].start)
    out = np.empty(ck.metas[name].shape, dtype=np.float32)
    with pytest.raises(GraftkitError, match="changed while it was read") as e:
        ck.readinto(name, out)
    assert f"{ck.raw[name].start:,} bytes now" in str(e.value)
    with pytest.raises(GraftkitError, match="changed while it was read"):
        ck.array(name)


# ------------------------------------------------------------------------------------- damaged results


@pytest.fixture
def damaged_run(run, tmp_path):
    """A copy of the run with a garbled-attributes copy and a truncated copy of its delta result."""
    r = tmp_path / "copy"
    shutil.copytree(run, r)
    good = next((r / "results").glob("*.h5"))
    garbled, cut = r / "results" / "garbled.h5", r / "results" / "cut.h5"
    shutil.copy(good, garbled)
    with h5py.File(garbled, "r+") as f:
        f.attrs["attrs"] = "{not json"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    return r, good, garbled, cut, len(data)


def test_read_result_classifies_the_damage(damaged_run):
    r, good, garbled, cut, n = damaged_run
    with pytest.raises(DamagedResult) as e:
        read_result(garbled)
    assert e.value.reason.startswith("garbled attributes: not valid JSON")
    with pytest.raises(DamagedResult) as e:
        read_result(cut)
    assert e.value.reason == f"truncated: {n // 2:,} of {n:,} bytes"
    found, damaged = scan_results(r)
    assert [Path(row["path"]) for row, _ in found] == [good]
    assert [d.path for d in damaged] == [cut, garbled]


def test_results_lists_damaged_files_with_the_reason(damaged_run, tmp_path):
    r, good, garbled, cut, n = damaged_run
    before = tree_hash(r)
    proc = gk("results", r, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [x["file"] for x in info["results"]] == [str(good.relative_to(r))]
    assert {x["file"]: x["reason"].split(":")[0] for x in info["damaged"]} == {
        "results/cut.h5": "truncated", "results/garbled.h5": "garbled attributes"}
    table = gk("results", r, cwd=tmp_path)
    rows = [line for line in table.stdout.splitlines() if "results/" in line]
    assert table.returncode == 0 and len(rows) == 3
    assert [("damaged" in x.split("│")[1], "truncated" in x) for x in rows if "cut.h5" in x] == [(True, True)]
    assert tree_hash(r) == before


def test_report_names_damaged_files_and_draws_the_rest(damaged_run, tmp_path):
    r, good, garbled, cut, n = damaged_run
    before = tree_hash(r)
    out = tmp_path / "report.html"
    proc = gk("report", r, "--out", out, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert "anatomy" in info["sections"] and info["figures"] >= 1
    assert [x for x in info["notes"] if x.startswith("damaged result file")] == [
        f"damaged result file {cut} left out of the report: truncated: {n // 2:,} of {n:,} bytes",
        f"damaged result file {garbled} left out of the report: garbled attributes: not valid JSON "
        "(Expecting property name enclosed in double quotes at character 1)"]
    page = out.read_text()
    assert "<section id='damaged' class='damaged'><h2>Damaged result files (2)</h2>" in page
    assert "<code>results/cut.h5</code>: truncated" in page and "<code>results/garbled.h5</code>: garbled" in page
    assert tree_hash(r) == before


def test_the_damage_notice_is_escaped(tmp_path):
    from graftkit.figures.report import make_report

    (tmp_path / "<b>x.h5").write_bytes(b"not hdf5")
    rep = make_report(tmp_path)
    assert "<code>&lt;b&gt;x.h5</code>: not an HDF5 file" in rep.html and "<b>x" not in rep.html
    assert [d.reason for d in rep.damaged] == ["not an HDF5 file"]


# ------------------------------------------------------------------------------------ stale temporaries


def test_next_writer_removes_stale_temporaries_of_dead_processes_only(pair, tmp_path):
    runs = tmp_path / "run"
    results = runs / "results"
    results.mkdir(parents=True)
    pid = dead_pid()
    stale = results / f".delta-rl.h5.tmp-{pid}"
    stale.write_bytes(b"\0" * 1000)
    live = results / f".other.h5.tmp-{os.getpid()}"
    live.write_bytes(b"\0" * 10)
    proc = gk("delta", "--base", pair.base, "--from", pair.rl, "--run", runs, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"removed 1 stale temporary (1000 B) in {results}" in proc.stderr.splitlines()
    assert not stale.exists() and live.exists()


def test_graft_export_removes_a_killed_exports_temporary_folder(pair, tmp_path):
    grafts = tmp_path / "grafts"
    pid = dead_pid()
    old = grafts / f".g.tmp-{pid}"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 4096)
    proc = gk("graft", "--from", pair.rl, "--base", pair.base, "--groups", "attn", "--out", grafts / "g", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"removed 1 stale temporary (4.0 KiB) in {grafts}" in proc.stderr.splitlines()
    assert sorted(p.name for p in grafts.iterdir()) == ["g"]


@pytest.mark.slow
def test_clean_lists_and_removes_stale_temporaries(tmp_path):
    run = tmp_path / "run"
    pid = dead_pid()
    (run / "results").mkdir(parents=True)
    (run / "results" / f".a.h5.tmp-{pid}").write_bytes(b"\0" * 100)
    ckpt = run / "rl.checkpoints" / f".step-000002.tmp-{pid}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 200)
    (run / f".report.html.tmp-{os.getpid()}").write_text("live")  # this test's own: a running process
    (run / ".partial-graft-single-rl.h5").write_text("a partial result, resumed later")
    dry = gk("clean", run, "--dry-run", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    info = json.loads(dry.stdout)
    assert sorted(Path(s["path"]).name for s in info["stale"]) == [f".a.h5.tmp-{pid}", f".step-000002.tmp-{pid}"]
    assert info["bytes"] == 300 and ckpt.exists()
    done = gk("clean", run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"2 stale temporaries (300 B) in {run}" in done.stdout
    assert temps(run) == [str(run / f".report.html.tmp-{os.getpid()}")]
    assert (run / ".partial-graft-single-rl.h5").exists()
    assert json.loads(gk("clean", run, "--json", cwd=tmp_path).stdout)["stale"] == []


def test_a_parked_previous_output_is_kept_while_it_is_the_only_copy(tmp_path):
    pid = dead_pid()
    (tmp_path / f".g.old-{pid}").mkdir()
    assert files.stale_temps(tmp_path) == []
    (tmp_path / "g").mkdir()
    assert [s.path.name for s in files.stale_temps(tmp_path)] == [f".g.old-{pid}"]


# -------------------------------------------------------------------------------------------- durability


def test_renames_into_place_are_followed_by_a_folder_fsync(tmp_path, monkeypatch):
    from graftkit.weights import writer

    events = []
    real_replace, real_fsync_dir = os.replace, files.fsync_dir
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", Path(b))), real_replace(a, b))[1])

    def fsync_dir(folder):
        events.append(("fsync", Path(folder)))
        real_fsync_dir(folder)

    monkeypatch.setattr(files, "fsync_dir", fsync_dir)
    monkeypatch.setattr(writer, "fsync_dir", fsync_dir)
    write_result(tmp_path / "r.h5", Result("x", {"i": np.arange(2)}, {"v": (("i",), np.zeros(2))}))
    assert events == [("rename", tmp_path / "r.h5"), ("fsync", tmp_path)]
    events.clear()
    with writer.atomic_folder(tmp_path / "out") as tmp:
        (tmp / "f").write_text("x")
    assert events[-2:] == [("rename", tmp_path / "out"), ("fsync", tmp_path)]


def test_os_errors_become_one_line_with_the_file_and_fix():
    import errno

    e = files.os_error(OSError(errno.ENOSPC, "No space left on device", "/x/y.h5"), flag="--save")
    assert str(e) == "writing /x/y.h5 failed: no space left on the device — free space there, or choose another --save"
    e = files.os_error(OSError("Unable to create file (unable to open file: name = 'a.h5', errno = 30, error "
                               "message = 'Read-only file system')"), "a.h5")
    assert str(e) == ("writing a.h5 failed: the file system is read-only — choose another output location on a "
                      "writable file system")


def test_any_os_error_from_a_command_is_one_line_and_exit_2(tmp_path, monkeypatch):
    import errno

    from typer.testing import CliRunner

    from graftkit import cli

    def broken(cfg):
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "results" / "x.h5"))

    monkeypatch.setattr(cli, "run_results", broken)
    res = CliRunner().invoke(cli.app, ["results", str(tmp_path)])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.strip() == (f"error: accessing {tmp_path / 'results' / 'x.h5'} failed: input/output error (the "
                                  "disk or network storage failed) — check the storage, then rerun")
