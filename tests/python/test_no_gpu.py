"""The Python package on a machine without a GPU, a driver, NCCL or torch: it imports, its C
library loads, and every failure is a clear exception of the right class, never a crash.
Run against the installed package (scripts/test.sh installs it into .venv)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import prepare

ZERO_ID = bytes(prepare._binding.UNIQUE_ID_BYTES)
BENCHES = Path(__file__).resolve().parents[2] / "benches"


def test_import_does_not_import_torch():
    code = "import sys, prepare; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_version_matches_the_library():
    assert prepare.__version__ == "0.2.0"
    assert prepare.native_version() == prepare.__version__


def test_the_installed_library_is_the_packaged_one():
    path = prepare.library_path()
    assert os.path.isfile(path), path
    if "PREPARE_LIBRARY" not in os.environ:
        assert os.path.dirname(path) == os.path.dirname(prepare.__file__)


def test_exceptions_form_one_family():
    for error in (prepare.InvalidArgument, prepare.PackageRefused, prepare.PeerTimeout,
                  prepare.RuntimeFailure, prepare.InternalError):
        assert issubclass(error, prepare.PrepareError)
    assert issubclass(prepare.InvalidArgument, ValueError)
    assert issubclass(prepare.PrepareError, RuntimeError)
    assert [error.status for error in (prepare.InvalidArgument, prepare.PackageRefused,
                                       prepare.PeerTimeout, prepare.RuntimeFailure,
                                       prepare.InternalError)] == [1, 2, 3, 4, 5]


def test_unique_id_is_128_bytes_or_says_nccl_is_missing():
    try:
        made = prepare.unique_id()
    except prepare.RuntimeFailure as error:
        assert "NCCL" in str(error)
    else:
        assert isinstance(made, bytes) and len(made) == 128


def test_a_missing_package_is_refused_by_name(tmp_path):
    missing = tmp_path / "no_such_package"
    with pytest.raises(prepare.PackageRefused) as caught:
        prepare.NativeHandle.open_unique_id(missing, ZERO_ID, 0, 2, 0)
    assert str(missing) in str(caught.value)
    assert caught.value.status == 2


def test_a_directory_without_manifest_is_refused_by_name(tmp_path):
    (tmp_path / "ladder.json").write_text("{}")
    with pytest.raises(prepare.PackageRefused) as caught:
        prepare.NativeHandle.open_unique_id([tmp_path], ZERO_ID, 0, 2, 0, timeout=1)
    assert "manifest.json" in str(caught.value)
    assert str(tmp_path) in str(caught.value)


def test_open_env_without_torchrun_variables_names_the_variable(monkeypatch, tmp_path):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(prepare.InvalidArgument, match="WORLD_SIZE is not set"):
        prepare.NativeHandle.open_env(tmp_path)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(packages=[]),
         "no package was given: give one package directory per collective and dtype"),
        (dict(tuning="fast"), "tuning='fast'"),
        (dict(timeout=0), "timeout=0"),
        (dict(timeout=float("nan")), "timeout=nan"),
        (dict(unique_id=b"short"), "unique_id must be 128 bytes"),
        (dict(world=1), "2 or more ranks"),
        (dict(rank=3), "rank 3 of 2"),
        (dict(device=-1), "device -1"),
    ],
)
def test_bad_arguments_are_invalid_arguments(tmp_path, arguments, message):
    call = dict(packages=[tmp_path], unique_id=ZERO_ID, rank=0, world=2, device=0)
    call.update(arguments)
    with pytest.raises(prepare.InvalidArgument, match=message.replace("(", r"\(")):
        prepare.NativeHandle.open_unique_id(**call)


def test_the_library_refuses_a_null_handle_itself():
    # Past the Python checks: the C library's own null check answers with a status.
    library = prepare._binding.library()
    assert library.prepare_check(None) == 1
    assert b"handle is NULL" in library.prepare_last_error()
    assert library.prepare_close(None) == 0


def test_dtype_names_map_to_the_c_codes():
    assert prepare.DTYPE_CODES == {"bf16": 0, "fp16": 1, "fp32": 2}
    with pytest.raises(prepare.InvalidArgument, match="'int8'"):
        prepare._binding.dtype_code("int8")


def test_collectives_without_torch_says_torch_is_needed():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs PyTorch"):
            prepare.Collectives("package")
    else:
        pytest.skip("torch is installed here; the GPU scripts test Collectives")


def bench_module(name):
    """A module of benches/allreduce_bench, the PyTorch all-reduce bench, imported here."""
    if str(BENCHES) not in sys.path:
        sys.path.insert(0, str(BENCHES))
    return importlib.import_module(f"allreduce_bench.{name}")


def test_every_bench_module_imports_without_torch():
    code = (
        "import importlib, pkgutil, sys\n"
        f"sys.path.insert(0, {str(BENCHES)!r})\n"
        "import allreduce_bench, pytorch_allreduce\n"
        "names = sorted(m.name for m in pkgutil.iter_modules(allreduce_bench.__path__))\n"
        "for name in names:\n"
        "    importlib.import_module('allreduce_bench.' + name)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(' '.join(names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert {"bench", "cli", "contenders", "main", "nccl_symmetric", "timing"} <= set(
        done.stdout.split()
    )


def test_bench_arguments_default_to_the_torch_contenders_in_order():
    cli = bench_module("cli")
    args = cli.parse_args([])
    assert args.contenders == list(cli.TORCH_CONTENDERS)
    assert args.sizes[0] == 8 << 10 and args.sizes[-1] == 64 << 20
    picked = cli.parse_args(["--contenders", "symm_mem_two_shot,torch_nccl", "--sizes", "4K,1M,4K"])
    assert picked.contenders == ["torch_nccl", "symm_mem_two_shot"]
    assert picked.sizes == [4096, 1 << 20]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "3"], "3 bytes"),
        (["--contenders", "gloo"], "unknown contender"),
        (["--contenders", "prepare_zero_copy"], "need --prepare PACKAGE"),
        (["--rounds", "0"], "--rounds must be at least 1"),
    ],
)
def test_bench_arguments_refuse_what_cannot_run(capsys, argv, message):
    cli = bench_module("cli")
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "code, version",
    [(22809, (2, 28, 9)), (22703, (2, 27, 3)), (23001, (2, 30, 1)), (21903, (2, 19, 3)),
     (2708, (2, 7, 8))],
)
def test_nccl_version_codes_are_decoded_in_both_encodings(code, version):
    assert bench_module("nccl_symmetric").decode_version(code) == version


def test_nccl_symmetric_refuses_nccl_before_2_27_and_says_why():
    nccl_symmetric = bench_module("nccl_symmetric")
    for code in (22703, 22809, 23001):
        assert nccl_symmetric.version_refusal(code) is None
    for code, shown in ((22609, "NCCL 2.26.9"), (21903, "NCCL 2.19.3"), (2708, "NCCL 2.7.8")):
        refusal = nccl_symmetric.version_refusal(code)
        assert shown in refusal and "2.27 or later" in refusal


def test_nccl_symmetric_finds_the_libnccl_files_mapped_in_the_process():
    maps = "\n".join([
        "7f10-7f20 r--p 00000000 08:01 11   /site-packages/nvidia/nccl/lib/libnccl.so.2",
        "7f20-7f30 r-xp 00001000 08:01 11   /site-packages/nvidia/nccl/lib/libnccl.so.2",
        "7f30-7f40 r--p 00000000 08:01 12   /opt/two words/libnccl.so.2.28.9",
        "7f40-7f50 r--p 00000000 08:01 13   /usr/lib/libnccl-net.so",
        "7f50-7f60 r--p 00000000 08:01 14   /old/libnccl.so.2 (deleted)",
        "7f60-7f70 rw-p 00000000 00:00 0    [heap]",
        "7f70-7f80 rw-p 00000000 00:00 0",
    ])
    assert bench_module("nccl_symmetric").mapped_nccl_libraries(maps) == [
        "/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/opt/two words/libnccl.so.2.28.9",
    ]


def test_nccl_symmetric_refuses_a_library_without_nccl_by_the_missing_entry_point():
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library to load by name here")
    with pytest.raises(RuntimeError, match=f"{libc} has no ncclGetVersion"):
        bench_module("nccl_symmetric").Nccl(libc)


@pytest.mark.parametrize("timeout", [1e19, 86401, 5e-324])
def test_a_timeout_out_of_range_is_an_invalid_argument(tmp_path, timeout):
    # Above 0 and finite, so past the Python checks: the library refuses it before it reads the
    # package, never as an internal error.
    with pytest.raises(prepare.InvalidArgument, match="timeout") as caught:
        prepare.NativeHandle.open_unique_id([tmp_path], ZERO_ID, 0, 2, 0, timeout=timeout)
    assert "at most 86400" in str(caught.value)


RULES = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "collective_rules.json"


def test_the_bench_bus_factors_are_the_shared_table_s():
    import json

    rules = bench_module("rules")
    cases = json.loads(RULES.read_text())["bus_factor"]
    assert len(cases) == 20
    for case in cases:
        got = rules.bus_factor(case["collective"], case["world"])
        assert got == pytest.approx(case["factor"], abs=1e-12), case
    with pytest.raises(ValueError, match="no bus factor"):
        rules.bus_factor("broadcast", 2)


def test_the_bench_shape_of_a_size_is_the_shared_table_s():
    import json

    rules = bench_module("rules")
    for case in json.loads(RULES.read_text())["bench_shape"]:
        bucket = tuple(case["bucket"]) if case["bucket"] else None
        got = rules.bench_shape(case["bytes"], case["element_bytes"], case["world"], bucket)
        assert got == (case["rows"], case["width"]), case


@pytest.mark.parametrize("rows", [0, 1, 3, 7, 8, 2047, 2048])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_the_bench_owned_rows_are_prepare_s(rows, world):
    rules = bench_module("rules")
    for rank in range(world):
        assert rules.owned_rows(rows, world, rank) == prepare.owned_rows(rows, world, rank)


def test_bench_arguments_pick_each_collective_s_contenders():
    cli = bench_module("cli")
    assert cli.parse_args(["--collective", "all_gather"]).contenders == ["torch_nccl"]
    both = cli.parse_args(["--collective", "reduce_scatter", "--prepare", "rs"])
    assert both.contenders == ["torch_nccl", "prepare_zero_copy", "prepare_any_tensor"]
    assert both.prepare == ["rs"]
    step = cli.parse_args(["--sequence-parallel", "--tokens", "1,64,1,2048"])
    assert step.contenders == ["torch_all_reduce", "torch_sequence_parallel"]
    assert step.tokens == [1, 64, 2048] and step.hidden == 7168
    served = cli.parse_args(["--sequence-parallel", "--prepare", "ar", "rs", "ag"])
    assert served.contenders == list(cli.STEP_CONTENDERS)
    assert served.prepare == ["ar", "rs", "ag"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--collective", "reduce_scatter", "--contenders", "symm_mem_two_shot"],
         "the reduce_scatter has no contender symm_mem_two_shot"),
        (["--contenders", "torch_sequence_parallel"], "the all_reduce has no contender"),
        (["--sequence-parallel", "--contenders", "prepare_all_reduce"], "need --prepare"),
        (["--sequence-parallel", "--tokens", "0"], "at least 1"),
        (["--collective", "broadcast"], "invalid choice"),
    ],
)
def test_bench_arguments_refuse_a_contender_the_collective_has_not(capsys, argv, message):
    cli = bench_module("cli")
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_the_bench_table_gives_each_row_its_shape():
    report = bench_module("report")
    row = {"bytes": 1 << 20, "contender": "torch_nccl", "median_us": 9.5, "min_us": 9.0,
           "max_us": 10.0, "bus_gbps": 55.2, "exact": True, "rows": 128, "width": 4096}
    line = report.Report.table_line(None, row)
    assert line.split()[:3] == ["1048576", "128x4096", "torch_nccl"], line
    step = dict(row, contender="prepare_sequence_parallel", tokens=8, hidden=7168)
    del step["rows"], step["width"]
    assert report.Report.table_line(None, step).split()[1] == "8x7168"
    plain = {key: value for key, value in row.items() if key not in ("rows", "width")}
    assert report.Report.table_line(None, plain).split()[1] == "torch_nccl"
    args = bench_module("cli").parse_args(["--collective", "all_gather"])
    assert report.what_is_timed(args) == "all-gather"
    assert report.what_is_timed(bench_module("cli").parse_args([])) == "all-reduce"
