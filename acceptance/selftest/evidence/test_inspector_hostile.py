"""Generated hostile checkpoint files and trees against the inspector's guarantees (hypothesis): nothing a pickle
names is imported (sys.modules unchanged), bounded time (DAG pickles, op floods) and memory (compressed,
overlapping, oversized zip entries), ASCII-digit iterations only, no link followed at open time, capped reports, and
the CLI's own budgets. Every refusal is named."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.evidence.checkpoints import inspector as ck
from harness.evidence.checkpoints import safe_pickle
from harness.base.paths import REPO
from harness.evidence.checkpoints.pickle_scan import TooComplex, UnknownClass, UnsafeContent, open_regular

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# modules whose import runs something (f2py's command line on the grader's argv, a browser, a GUI ...)
SIDE_EFFECT_MODULES = ["numpy.f2py.__main__", "antigravity", "this", "turtle", "idlelib.idle", "pip.__main__",
                       "pydoc", "webbrowser", "megatron.training.arguments", "megatron.training", "torch.testing",
                       "os", "subprocess", "builtins", "torch._dynamo", "numpy.distutils"]
IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
MODULES = st.one_of(st.sampled_from(SIDE_EFFECT_MODULES), st.lists(IDENT, min_size=1, max_size=4).map(".".join),
                    st.lists(IDENT, min_size=1, max_size=3).map(lambda p: "megatron." + ".".join(p)))


@pytest.fixture(autouse=True, scope="module")
def suite_imports():
    """What the suite itself imports to read checkpoints (torch, its DCP classes, the table), loaded once before
    sys.modules is compared: only what a pickle names must not be imported."""
    safe_pickle._table()
    safe_pickle.loads_dcp_metadata(b"\x80\x04N.")
    with zipfile.ZipFile(io.BytesIO(torch_zip(b"\x80\x02N."))) as zf:   # zipfile's own cp437 name codec
        zf.infolist()


@contextlib.contextmanager
def within(seconds: float):
    """Fail (not hang) if the block runs longer than `seconds`."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds} s: not bounded")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def torch_zip(data_pkl: bytes, compress: int = zipfile.ZIP_STORED, extra: dict | None = None) -> bytes:
    """A torch.save-shaped archive (archive/data.pkl, archive/version, archive/data/<key>)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl"), data_pkl, compress_type=compress)
        zf.writestr("archive/version", b"3\n")
        for key, blob in (extra or {}).items():
            zf.writestr(f"archive/data/{key}", blob)
    return buf.getvalue()


def global_pickle(module: str, name: str, protocol_4: bool) -> bytes:
    """A pickle calling module.name(): GLOBAL, or STACK_GLOBAL with memoized strings (as protocol 4 writes)."""
    if protocol_4:
        strings = b"".join(b"\x8c" + bytes([len(s)]) + s + b"\x94" for s in (module.encode(), name.encode()))
        return b"\x80\x04" + strings + b"\x93)R."
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n)R."


def dag_pickle(levels: int, kind: str) -> bytes:
    """t0 = (); t_i = (t_{i-1}, t_{i-1}) (or a frozenset/list of them); {t_n: None}: ~10 bytes a level."""
    def put(i):
        return b"r" + struct.pack("<I", i)

    def get(i):
        return b"j" + struct.pack("<I", i)

    out = [b"\x80\x04)", put(0)]
    for i in range(1, levels + 1):
        if kind == "tuple":
            out += [get(i - 1), get(i - 1), b"\x86", put(i)]
        elif kind == "list":
            out += [b"]", put(i), b"(", get(i - 1), get(i - 1), b"e"]
        else:
            out += [b"(", get(i - 1), get(i - 1), b"\x91", put(i)]
    out += [b"}", get(levels), b"Ns."]
    return b"".join(out)


# ---------------------------------------------------------------- nothing imported by name

def test_numpy_f2py_main_is_not_imported():
    """The probe of issue #31: `numpy.f2py.__main__.x` in common.pt ran f2py's main while the allowlist decided."""
    before = set(sys.modules)
    with pytest.raises(UnsafeContent, match="numpy.f2py.__main__.x"):
        safe_pickle.loads_vetted(global_pickle("numpy.f2py.__main__", "x", False))
    assert "numpy.f2py.__main__" not in sys.modules and set(sys.modules) == before


@SETTINGS
@given(module=MODULES, name=IDENT, protocol_4=st.booleans(), where=st.sampled_from([".metadata", "common.pt"]))
def test_no_pickled_name_is_imported(tmp_path, module, name, protocol_4, where):
    """Any (module, name) a pickle names: refused by name (UnknownClass under megatron., UnsafeContent otherwise,
    or a name the table knows read as that), and sys.modules is what it was."""
    data = global_pickle(module, name, protocol_4)
    before = set(sys.modules)
    path = tmp_path / where
    path.write_bytes(data if where == ".metadata" else torch_zip(data))
    read = safe_pickle.load_dcp_metadata if where == ".metadata" else safe_pickle.safe_torch_load
    with within(5):
        try:
            read(path)
        except (UnsafeContent, UnknownClass) as exc:
            assert exc.name.startswith(f"{module}.{name}")
            assert isinstance(exc, UnknownClass) == module.startswith("megatron.") \
                or (module.startswith("megatron.") and where == ".metadata")
        except Exception:  # noqa: BLE001 - a known name called with no argument fails: still nothing imported
            assert (module, name) in safe_pickle._table()
    assert set(sys.modules) == before, sorted(set(sys.modules) - before)


# ---------------------------------------------------------------- bounded time

@SETTINGS
@given(levels=st.integers(24, 300), kind=st.sampled_from(["tuple", "frozenset", "list"]),
       where=st.sampled_from([".metadata", "common.pt"]))
def test_dag_pickles_are_refused_quickly(tmp_path, levels, kind, where):
    """A DAG of shared containers 2^levels nodes expanded (hashing it as a dict key never ends): refused by the
    scan, before anything is built, in well under a second."""
    data = dag_pickle(levels, kind)
    path = tmp_path / where
    path.write_bytes(data if where == ".metadata" else torch_zip(data))
    read = safe_pickle.load_dcp_metadata if where == ".metadata" else safe_pickle.safe_torch_load
    start = time.monotonic()
    with within(5), pytest.raises(TooComplex, match="shared references|deeper"):
        read(path)
    assert time.monotonic() - start < 2


def test_the_412_byte_dag_in_a_save_folder_is_named(tmp_path):
    """In a --save folder: the report refuses the file as unsafe content and says why, in seconds."""
    it = tmp_path / "save" / "iter_0000005"
    it.mkdir(parents=True)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (it / ".metadata").write_bytes(dag_pickle(40, "tuple"))
    (it / "__0_0.distcp").write_bytes(b"\0")
    (it / "common.pt").write_bytes(torch_zip(dag_pickle(40, "tuple")))
    with within(10):
        report = ck.inspect_save_dir(tmp_path / "save")
    refused = [p for p in report.problems if "refused: unsafe content" in p and "shared references" in p]
    assert len(refused) == 2 and not report.loaded, report.problems


@pytest.mark.parametrize("data,reason", [
    (b"\x80\x04" + b"N0" * 160_000 + b"N.", "pickle ops"),
    (b"\x80\x04" + b"(" * 200 + b"t" * 200 + b".", "deeper"),
    (b"\x80\x04N" + b"r\xff\xff\xff\x7f" + b".", "memo index"),
    (b"\x80\x04\x82\x01.", "extension"),
])
def test_op_floods_nesting_memo_and_extensions_are_refused(data, reason):
    with within(10), pytest.raises((TooComplex, UnsafeContent), match=reason):
        safe_pickle.loads_dcp_metadata(data)


# ---------------------------------------------------------------- bounded memory: zip layouts

def _overlapping(data_pkl: bytes) -> bytes:
    """Two stored entries whose central-directory offsets point at the same bytes (a 129 KB file inflating)."""
    raw = bytearray(torch_zip(data_pkl, extra={"0": b"\0" * 4096}))
    first = raw.index(b"PK\x01\x02")
    offsets = []
    pos = first
    while pos != -1:
        offsets.append(pos)
        pos = raw.find(b"PK\x01\x02", pos + 4)
    data_offset = struct.unpack_from("<I", raw, offsets[0] + 42)[0]
    struct.pack_into("<I", raw, offsets[-1] + 42, data_offset)
    return bytes(raw)


def _declared_bigger(data_pkl: bytes) -> bytes:
    """The central directory declares a storage of 2 GB uncompressed while 4 KB are stored."""
    raw = bytearray(torch_zip(data_pkl, extra={"0": b"\0" * 4096}))
    last = raw.rindex(b"PK\x01\x02")
    struct.pack_into("<I", raw, last + 24, 2 << 30)
    return bytes(raw)


@SETTINGS
@given(layout=st.sampled_from(["deflated", "overlapping", "declared-bigger"]), payload=st.integers(1, 2000))
def test_zip_layouts_that_inflate_are_refused_before_reading(tmp_path, layout, payload):
    """Compressed entries (torch writes them stored), overlapping entries and declared sizes beyond what is
    stored: refused from the central directory, with little memory (tracemalloc peak < 32 MB)."""
    import pickle

    data = pickle.dumps({"iteration": 5, "pad": "x" * payload}, protocol=2)
    blob = {"deflated": lambda d: torch_zip(d, zipfile.ZIP_DEFLATED), "overlapping": _overlapping,
            "declared-bigger": _declared_bigger}[layout](data)
    path = tmp_path / "common.pt"
    path.write_bytes(blob)
    tracemalloc.start()
    try:
        with within(5), pytest.raises(TooComplex, match="compressed|overlaps|declares"):
            safe_pickle.safe_torch_load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20


def test_a_tensor_bigger_than_its_storage_record_is_refused_without_allocating(tmp_path):
    """A storage declaring 2^40 elements over a 16-byte record, and a view reaching past its storage."""
    import pickle

    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        data = zf.read(name)
    big = data.replace(b"K\x04", b"\x8a\x06\x00\x00\x00\x00\x00\x01", 1)  # numel 4 -> 2^40
    path = tmp_path / "common.pt"
    path.write_bytes(torch_zip(big, extra={"0": b"\0" * 16}))
    with pytest.raises(pickle.UnpicklingError, match="holds 16 bytes"):
        safe_pickle.safe_torch_load(path)
    path.write_bytes(torch_zip(data, extra={"0": b"\0" * 16}))
    assert tuple(safe_pickle.safe_torch_load(path)["w"].shape) == (4,)   # the untouched one reads, on meta
    assert safe_pickle.safe_torch_load(path)["w"].device.type == "meta"


# ---------------------------------------------------------------- names: ASCII digits only

NON_ASCII_DIGITS = st.characters(categories=["Nd"]).filter(lambda c: not c.isascii())


@SETTINGS
@given(digits=st.lists(st.one_of(NON_ASCII_DIGITS, st.sampled_from("0123456789")), min_size=7, max_size=7)
       .filter(lambda ds: not all(d.isascii() for d in ds)))
def test_unicode_digits_are_no_iteration(tmp_path, digits):
    """iter_٠٠٠٠٠٠٥ is not iteration 5, and a tracker of Unicode digits is no iteration number; "5\\n" is."""
    save = tmp_path / f"save{len(list(tmp_path.iterdir()))}"
    (save / f"iter_{''.join(digits)}").mkdir(parents=True)
    (save / ck.TRACKER_FILE).write_text("".join(digits).lstrip("0") or "0")
    report = ck.inspect_save_dir(save, load=False)
    assert report.iterations == () and report.tracker is None
    assert ck.tracker_iteration(save) is None
    (save / ck.TRACKER_FILE).write_text("5\n")
    assert ck.tracker_iteration(save) == 5


def test_many_empty_iteration_folders_make_a_small_report(tmp_path):
    """30,000 empty iter_ folders (100,000 made a 32 MB grade): problems capped with a count, seconds."""
    save = tmp_path / "save"
    save.mkdir()
    for i in range(30_000):
        os.mkdir(save / f"iter_{i:07d}")
    (save / ck.TRACKER_FILE).write_text("29999")
    with within(60):
        report = ck.inspect_save_dir(save, load=False)
    assert len(report.problems) <= ck.MAX_PROBLEMS
    assert any("more problems not listed" in p for p in report.problems)
    assert any("30,000 iteration folders" in p for p in report.problems)
    assert len(json.dumps(report.problems)) < 20_000


# ---------------------------------------------------------------- links at open time

@SETTINGS
@given(component=st.sampled_from(["iter", "file"]), target_inside=st.booleans())
def test_no_link_is_followed_at_open_time(tmp_path, component, target_inside):
    """A component swapped for a symlink (the folder or the file; pointing inside or outside) after any check is
    refused when it is opened relative to the --save folder."""
    case = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    save, outside = case / "save", case / "outside"
    (save / "iter_0000005").mkdir(parents=True)
    outside.mkdir(parents=True)
    (outside / ".metadata").write_bytes(b"secret")
    (save / "real").mkdir()
    (save / "real" / ".metadata").write_bytes(b"inside")
    target_dir = save / "real" if target_inside else outside
    if component == "iter":
        (save / "iter_0000005").rmdir()
        (save / "iter_0000005").symlink_to(target_dir)
    else:
        (save / "iter_0000005" / ".metadata").symlink_to(target_dir / ".metadata")
    with pytest.raises(OSError):
        open_regular(save / "iter_0000005" / ".metadata", None, save)


def test_a_fifo_is_never_opened_for_reading(tmp_path):
    save = tmp_path / "save"
    (save / "iter_0000005").mkdir(parents=True)
    os.mkfifo(save / "iter_0000005" / ".metadata")
    with within(5), pytest.raises(OSError, match="not a regular file"):
        open_regular(save / "iter_0000005" / ".metadata", None, save)


# ---------------------------------------------------------------- the CLI's own budgets

def _cli(*args, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "harness.evidence.checkpoints.inspector", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def test_cli_wall_clock_budget_is_enforced(tmp_path):
    """--budget-s 0.3 (less than importing torch takes): the child is killed, the report names the budget."""
    start = time.monotonic()
    out, err = _cli(REPO / "fixtures" / "checkpoints" / "core_v0.18.2", "--no-load", "--budget-s", "0.3") \
        .communicate(timeout=60)
    report = json.loads(out)
    assert "ran past its 0.3 s budget" in report["problems"][0] and time.monotonic() - start < 20


def test_cli_memory_budget_is_enforced(tmp_path):
    """--budget-mb 64: the child cannot even import torch; the report names the address-space budget."""
    proc = _cli(REPO / "fixtures" / "checkpoints" / "core_v0.18.2", "--no-load", "--budget-mb", "64")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "64 MB address-space budget" in json.loads(out)["problems"][0]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                for c in (t / "children").read_text().split()]
    except OSError:
        return []


def test_cli_stops_on_sigterm(tmp_path):
    """SIGTERM reaches the CLI once it supervises its inspecting child: it kills the child and exits 143 at once."""
    proc = _cli(REPO / "fixtures" / "checkpoints" / "core_v0.18.2", "--no-load")
    deadline = time.monotonic() + 60
    while not _children(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    children = _children(proc.pid)
    assert children, "the CLI started no inspecting child"
    time.sleep(0.2)   # the supervisor's handlers are installed right after the child starts
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - start < 10
    time.sleep(0.2)
    assert not [c for c in children if Path(f"/proc/{c}").exists()
                and "Z" not in (Path(f"/proc/{c}/stat").read_text().split()[2:3] or ["Z"])], "the child outlived it"
