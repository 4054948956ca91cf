"""The binding's own checks, without a GPU: every integer is refused outside its C type's range
and every string holding a NUL byte is refused, before ctypes would wrap or cut it; every
error is the class of its status; the library is refused by name when it is not this
package's; a handle is made only by the library's open functions. Run against the installed
package (scripts/test.sh installs it into .venv)."""

import _ctypes
import subprocess
import sys
import types

import pytest

import prepare

ZERO_ID = bytes(prepare._binding.UNIQUE_ID_BYTES)
UINT32 = "from 0 to 4294967295 (uint32_t)"
INT32 = "from -2147483648 to 2147483647 (int32_t)"
UINT64 = "from 0 to 18446744073709551615 (uint64_t)"
SIZE = "from 0 to 18446744073709551615 (size_t)"
POINTER = "from 0 to 18446744073709551615 (a pointer)"


def refused(call, *needles, error=prepare.InvalidArgument):
    """The error `call` raises, which must be exactly `error` and name every needle."""
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    for needle in needles:
        assert needle in str(caught.value)
    return caught.value


def closed_handle():
    # The state of a handle after close(), without a GPU to open one.
    return prepare.NativeHandle.__new__(prepare.NativeHandle)


class Index:
    """An integer type of another library (numpy's, torch's): it converts through __index__."""

    def __index__(self):
        return 3


# Integers.

@pytest.mark.parametrize(
    "name, value, shown",
    [
        ("rank", 2**32, "rank=4294967296 is out of range: give an integer " + UINT32),
        ("rank", 2**64, "rank=18446744073709551616 is out of range: give an integer " + UINT32),
        ("rank", -1, "rank=-1 is out of range: give an integer " + UINT32),
        ("world", 2**32 + 2, "world=4294967298 is out of range: give an integer " + UINT32),
        ("device", 2**32, "device=4294967296 is out of range: give an integer " + INT32),
        ("device", -2**31 - 1, "device=-2147483649 is out of range: give an integer " + INT32),
        ("rank", 1 << 20000, "rank=<an integer of 20001 bits> is out of range"),
        ("rank", 0.0, "rank is a float: give an integer from 0 to 4294967295"),
        ("world", True, "world is a bool: give an integer from 0 to 4294967295"),
        ("device", "0", "device is a str: give an integer from -2147483648"),
    ],
    ids=["rank-2^32", "rank-2^64", "rank-negative", "world-2^32+2", "device-2^32",
         "device-below-int32", "rank-of-6021-digits", "rank-float", "world-bool", "device-str"],
)
def test_open_unique_id_refuses_integers_outside_their_c_type(tmp_path, name, value, shown):
    call = dict(packages=[tmp_path], unique_id=ZERO_ID, rank=0, world=2, device=0, timeout=1)
    call[name] = value
    refused(lambda: prepare.NativeHandle.open_unique_id(**call), shown)


def test_an_integer_of_another_library_is_taken_by_its_index(tmp_path):
    # rank 3 reaches the library as 3, which refuses it as a rank of 2.
    refused(lambda: prepare.NativeHandle.open_unique_id(tmp_path, ZERO_ID, Index(), 2, 0),
            "rank 3 of 2")


@pytest.mark.parametrize(
    "arguments, shown",
    [
        (dict(nccl_comm=-1), "nccl_comm=-1 is out of range: give an integer " + POINTER),
        (dict(nccl_comm=2**64), "nccl_comm=18446744073709551616 is out of range"),
        (dict(rank=2**32), "rank=4294967296 is out of range: give an integer " + UINT32),
        (dict(device=2**31), "device=2147483648 is out of range: give an integer " + INT32),
    ],
    ids=["nccl_comm-negative", "nccl_comm-2^64", "rank-2^32", "device-2^31"],
)
def test_open_comm_refuses_integers_outside_their_c_type(tmp_path, arguments, shown):
    call = dict(packages=[tmp_path], nccl_comm=1, rank=0, world=2, device=0, timeout=1)
    call.update(arguments)
    refused(lambda: prepare.NativeHandle.open_comm(**call), shown)


@pytest.mark.parametrize(
    "timeout, shown",
    [(True, "timeout is a bool"), ("60", "timeout is a str"),
     (10**400, "timeout is too large for seconds")],
    ids=["bool", "str", "10^400"],
)
def test_a_timeout_that_is_not_a_number_of_seconds_is_refused(tmp_path, timeout, shown):
    refused(lambda: prepare.NativeHandle.open_unique_id(tmp_path, ZERO_ID, 0, 2, 0,
                                                        timeout=timeout), shown)


@pytest.mark.parametrize(
    "method, arguments, shown",
    [
        ("route", (0, 0, 2**64), "nbytes=18446744073709551616 is out of range: give an integer "
         + UINT64),
        ("route", (0, 0, -1), "nbytes=-1 is out of range"),
        ("route", (0, 2**31, 0), "dtype=2147483648 is out of range: give an integer " + INT32),
        ("force", (0, 0, 2**64, "nccl"), "bucket=18446744073709551616 is out of range: give an "
         "integer " + SIZE),
        ("force", (0, 0, -1, "nccl"), "bucket=-1 is out of range"),
        ("force", (0, 0, 1.5, "nccl"), "bucket is a float"),
        ("all_reduce", (-1, 0, 1, 0, None), "input=-1 is out of range: give an integer "
         + POINTER),
        ("all_reduce", (0, 2**64, 1, 0, None), "output=18446744073709551616 is out of range"),
        ("all_reduce", (0, 0, 2**64, 0, None), "count=18446744073709551616 is out of range"),
        ("all_reduce", (0, 0, 1, -2**31 - 1, None), "dtype=-2147483649 is out of range"),
        ("all_reduce", (0, 0, 1, 0, -1), "stream=-1 is out of range"),
        ("choice_json", (0, 2**32), "dtype=4294967296 is out of range"),
        ("serves", (0, 2**32), "dtype=4294967296 is out of range"),
        ("zero_copy_region", (0, 2**32), "dtype=4294967296 is out of range"),
        ("route", (2**31, 0, 0), "collective=2147483648 is out of range: give an integer "
         + INT32),
        ("choice_json", (-2**31 - 1, 0), "collective=-2147483649 is out of range"),
        ("force", (2**32, 0, 0, "nccl"), "collective=4294967296 is out of range"),
    ],
    ids=["route-nbytes-2^64", "route-nbytes-negative", "route-dtype-2^31", "force-bucket-2^64",
         "force-bucket-negative", "force-bucket-float", "all_reduce-input-negative",
         "all_reduce-output-2^64", "all_reduce-count-2^64", "all_reduce-dtype-below-int32",
         "all_reduce-stream-negative", "choice_json-dtype-2^32", "serves-dtype-2^32",
         "zero_copy_region-dtype-2^32", "route-collective-2^31",
         "choice_json-collective-below-int32", "force-collective-2^32"],
)
def test_handle_methods_refuse_integers_outside_their_c_type(method, arguments, shown):
    # Arguments are checked before the handle's state, so a closed handle shows the check.
    refused(lambda: getattr(closed_handle(), method)(*arguments), shown)


# Strings.

def test_a_package_path_with_a_nul_byte_is_refused_not_cut(tmp_path):
    cut = str(tmp_path) + "/x\0/../y"
    error = refused(lambda: prepare.NativeHandle.open_unique_id([cut], ZERO_ID, 0, 2, 0),
                    "packages[0]", "embedded null byte")
    assert isinstance(error, ValueError)
    refused(lambda: prepare.NativeHandle.open_env([tmp_path, b"/tmp/x\0y"]),
            "packages[1]", "embedded null byte")


def test_a_cache_dir_with_a_nul_byte_is_refused_not_cut(tmp_path):
    refused(lambda: prepare.NativeHandle.open_unique_id(
        tmp_path, ZERO_ID, 0, 2, 0, cache_dir=str(tmp_path) + "\0cache"),
        "cache_dir", "embedded null byte")


def test_a_profile_with_a_nul_byte_or_of_another_type_is_refused():
    refused(lambda: closed_handle().force(0, 0, 0, "nccl\0one_shot_push"),
            "profile", "embedded null byte")
    refused(lambda: closed_handle().force(0, 0, 0, b"nccl"), "profile is a bytes: give a str")


def test_packages_of_another_type_are_refused_by_name(tmp_path):
    refused(lambda: prepare.NativeHandle.open_unique_id(7, ZERO_ID, 0, 2, 0),
            "packages is an int")
    refused(lambda: prepare.NativeHandle.open_unique_id([tmp_path, 7], ZERO_ID, 0, 2, 0),
            "packages[1] is an int: give a path")


def fake_torch(monkeypatch, cuda, initialized):
    """A stand-in for torch with what `Collectives` asks before its bootstrap."""
    torch = types.ModuleType("torch")
    torch.distributed = types.ModuleType("torch.distributed")
    torch.distributed.is_available = lambda: True
    torch.distributed.is_initialized = lambda: initialized
    torch.cuda = types.SimpleNamespace(is_available=lambda: cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
    monkeypatch.setattr(prepare.collectives, "_TORCH", None)


def test_collectives_checks_its_options_before_torch_and_raises_one_class_per_status(
        monkeypatch):
    fake_torch(monkeypatch, cuda=False, initialized=False)
    refused(lambda: prepare.Collectives(["pkg\0other"]), "packages[0]", "embedded null byte")
    refused(lambda: prepare.Collectives("pkg", cache_dir="cache\0"), "cache_dir")
    refused(lambda: prepare.Collectives("pkg", timeout=True), "timeout is a bool")
    refused(lambda: prepare.Collectives("pkg", allow_inexact="False"),
            "allow_inexact is a str: give True or False")
    refused(lambda: prepare.Collectives("pkg"), "no CUDA GPU", error=prepare.RuntimeFailure)
    fake_torch(monkeypatch, cuda=True, initialized=False)
    refused(lambda: prepare.Collectives("pkg"), "torch.distributed is not initialized")


# The exactness policy.

def test_the_options_are_exact_unless_inexact_candidates_are_allowed(tmp_path):
    # What the library receives: prepare_options_init's 0 unless allow_inexact=True.
    exact, _keep = prepare.NativeHandle._options([tmp_path], None, 60, "runtime", False)
    assert exact.allow_inexact == 0
    allowed, _keep = prepare.NativeHandle._options([tmp_path], None, 60, "runtime", False,
                                                   allow_inexact=True)
    assert allowed.allow_inexact == 1


@pytest.mark.parametrize("value", [1, 0, "True", None])
def test_allow_inexact_that_is_not_a_bool_is_refused_before_the_library(tmp_path, value):
    for open_handle in (
            lambda: prepare.NativeHandle.open_unique_id(
                [tmp_path], ZERO_ID, 0, 2, 0, allow_inexact=value),
            lambda: prepare.NativeHandle.open_env([tmp_path], allow_inexact=value),
            lambda: prepare.NativeHandle.open_comm([tmp_path], 1, 0, 2, 0,
                                                   allow_inexact=value)):
        refused(open_handle, f"allow_inexact is {prepare._binding._kind(value)}: give True or "
                "False")


# One class per status.

def test_every_error_raised_is_the_class_of_its_status():
    with pytest.raises(TypeError, match="subclasses"):
        prepare.PrepareError("which status?")
    for status, error in prepare._binding._ERRORS.items():
        assert refused(lambda: prepare._binding._check(status), error=error).status == status
    unknown = refused(lambda: prepare._binding._check(99), "status 99",
                      error=prepare.InternalError)
    assert unknown.status == 5


def test_use_after_close_is_an_invalid_argument():
    handle = closed_handle()
    handle.close()
    for call in (handle.check, lambda: handle.route(0, 0, 2), lambda: handle.choice_json(0, 0),
                 lambda: handle.serves(0, 0), lambda: handle.zero_copy_region(0, 0),
                 lambda: handle.force(0, 0, 0, "nccl"), lambda: handle.all_reduce(1, 1, 1, 0, 0)):
        assert refused(call, "closed").status == 1
    collectives = prepare.Collectives.__new__(prepare.Collectives)
    collectives._native, collectives._id = None, None
    # Without torch: the calls that check the handle before any tensor.
    for call in (collectives.check, lambda: collectives.all_reduce(None)):
        assert refused(call, "closed").status == 1


# Making a handle.

def test_a_handle_cannot_be_made_from_an_integer():
    # In a process of its own: a handle made from 0x1000 crashed the process when collected.
    code = (
        "import gc, prepare\n"
        "try:\n"
        "    prepare.NativeHandle(0x1000)\n"
        "except TypeError as error:\n"
        "    print(error)\n"
        "gc.collect()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "made by NativeHandle.open_unique_id, open_env or open_comm" in done.stdout


# Loading the library.

@pytest.fixture
def unloaded(monkeypatch):
    """The package as before its first call into the library; restored afterwards."""
    monkeypatch.setattr(prepare._binding, "_library", None)
    monkeypatch.setattr(prepare._binding, "_library_path", None)
    return monkeypatch


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda root: root / "missing" / "libprepare_c.so", "which does not exist"),
        (lambda root: root, "which is a directory, not the library file"),
        (lambda root: (root / "text.so").write_text("not a library") and root / "text.so",
         "which cannot be loaded"),
        (lambda root: _ctypes.__file__, "which is not prepare's C library: it has no "
         "prepare_version"),
    ],
    ids=["missing", "directory", "not-a-library", "another-library"],
)
def test_prepare_library_naming_a_bad_file_is_an_import_error_naming_it(unloaded, tmp_path,
                                                                          make, what):
    path = str(make(tmp_path))
    unloaded.setenv("PREPARE_LIBRARY", path)
    error = refused(prepare.native_version, f"PREPARE_LIBRARY names {path}, {what}",
                    "unset it", error=ImportError)
    assert error.path == path


@pytest.mark.parametrize("named_by_variable", [False, True], ids=["installed", "variable"])
def test_a_library_of_another_version_is_refused_naming_both_and_the_file(unloaded,
                                                                           named_by_variable):
    if named_by_variable:
        unloaded.setenv("PREPARE_LIBRARY", prepare.library_path())
    else:
        unloaded.delenv("PREPARE_LIBRARY", raising=False)
    path, version = prepare.library_path(), prepare.__version__
    where = f"PREPARE_LIBRARY names {path}," if named_by_variable else f"prepare, {path},"
    unloaded.setattr(prepare, "__version__", "0.0.9")
    refused(prepare.native_version,
            f"{where} which is prepare {version}, but this package is prepare 0.0.9",
            error=ImportError)


@pytest.mark.parametrize("named_by_variable", [False, True], ids=["installed", "variable"])
def test_a_library_of_another_abi_version_is_refused_naming_both_and_the_file(unloaded,
                                                                               named_by_variable):
    if named_by_variable:
        unloaded.setenv("PREPARE_LIBRARY", prepare.library_path())
    else:
        unloaded.delenv("PREPARE_LIBRARY", raising=False)
    path = prepare.library_path()
    where = f"PREPARE_LIBRARY names {path}," if named_by_variable else f"prepare, {path},"
    assert prepare._binding.ABI_VERSION == 2
    unloaded.setattr(prepare._binding, "ABI_VERSION", 7)
    refused(prepare.native_version,
            f"{where} which offers C ABI version 2, but this package is written for C ABI "
            "version 7", error=ImportError)


def test_the_library_offers_the_abi_version_the_package_is_written_for():
    assert prepare._binding.library().prepare_abi_version() == prepare._binding.ABI_VERSION


@pytest.mark.parametrize("name, code", [("all_reduce", 0), ("reduce_scatter", 1),
                                        ("all_gather", 2), ("all_reduce_add_rms_norm", 3)])
def test_a_collective_is_named_as_the_c_library_numbers_it(name, code):
    from prepare import collectives
    assert collectives._collective_code(name) == code


@pytest.mark.parametrize("collective", ["allreduce", "ALL_REDUCE", "", 0, None, b"all_reduce"])
def test_a_collective_of_no_such_name_is_refused_listing_the_names(collective):
    from prepare import collectives
    with pytest.raises(prepare.InvalidArgument) as raised:
        collectives._collective_code(collective)
    assert (f"collective={collective!r}: give one of 'all_reduce', 'reduce_scatter', "
            "'all_gather', 'all_reduce_add_rms_norm'") in str(raised.value)


def test_a_collective_and_dtype_no_package_holds_is_refused_naming_what_is_served():
    """The keyword `collective=` of route, force, empty, zero_copy_bytes and choice: checked
    against what the handle's packages hold before anything reaches the library (no torch or
    GPU needed: the handle's table is set by hand)."""
    from prepare import collectives
    handle = object.__new__(collectives.Collectives)
    handle._names = {"bf16 dtype": "bf16", "fp16 dtype": "fp16"}
    handle._served = [("all_reduce", "bf16 dtype")]
    assert handle._pair("all_reduce", "bf16 dtype") == (0, 0)
    with pytest.raises(prepare.InvalidArgument,
                       match="no package holds reduce_scatter bf16 dtype; this handle serves "
                             "all_reduce bf16 dtype"):
        handle._pair("reduce_scatter", "bf16 dtype")
    with pytest.raises(prepare.InvalidArgument, match="no package holds all_reduce fp16 dtype"):
        handle._pair("all_reduce", "fp16 dtype")
    with pytest.raises(prepare.InvalidArgument, match="collective='allreduce'"):
        handle._pair("allreduce", "bf16 dtype")
