"""The binding's copy of the C ABI against `prepare.h`, the header the build generates from the
library's source: every function with its argument and result types, `PrepareOptions` field by
field, the status, dtype and tuning codes and the unique id's size. ctypes trusts the binding's
declarations, so a difference would be a call through the wrong layout.

The header is `$PREPARE_HEADER`, else `include/prepare.h` of the Cargo profile the package was
built with (`$PREPARE_WHEEL_PROFILE`, release by default as for the package) in
`$CARGO_TARGET_DIR` (default: the checkout's `target/`)."""

import ctypes
import os
import re
from pathlib import Path

import pytest

from prepare import _binding

ROOT = Path(__file__).resolve().parents[2]


def header_path() -> Path:
    named = os.environ.get("PREPARE_HEADER")
    if named:
        return Path(named)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    if not target.is_absolute():
        target = ROOT / target
    return target / os.environ.get("PREPARE_WHEEL_PROFILE", "release") / "include" / "prepare.h"


@pytest.fixture(scope="module")
def header() -> str:
    path = header_path()
    if not path.is_file():
        pytest.fail(f"no generated header at {path}: build the C library first (`cargo build -p "
                    "prepare-c`, or the package's pip install), or set PREPARE_HEADER")
    return path.read_text()


# The ctypes type the binding uses for each C type, consts dropped (they do not change the
# layout). Pointers to opaque or byte data are plain addresses (c_void_p).
SCALARS = {
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "double": ctypes.c_double,
    "float": ctypes.c_float,
    # A #[repr(C)] enum is a C enum: an int.
    "enum PrepareStatus": ctypes.c_int,
}
ADDRESSES = {"void", "uint8_t", "struct PrepareHandle"}


def ctype_of(c_type: str):
    """The ctypes type for `c_type` ("const char *const *"), or None for one not listed."""
    words = [word for word in c_type.replace("*", " * ").split() if word != "const"]
    stars = words.count("*")
    base = " ".join(word for word in words if word != "*")
    if base == "char" and stars:
        pointee, stars = ctypes.c_char_p, stars - 1
    elif base in ADDRESSES and stars:
        pointee, stars = ctypes.c_void_p, stars - 1
    elif base == "struct PrepareOptions" and stars:
        pointee, stars = ctypes.POINTER(_binding._Options), stars - 1
    elif base in SCALARS:
        pointee = SCALARS[base]
    else:
        return None
    for _ in range(stars):
        pointee = ctypes.POINTER(pointee)
    return pointee


def without_comments(header: str) -> str:
    header = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    header = re.sub(r"//[^\n]*", " ", header)
    return "\n".join(line for line in header.splitlines() if not line.lstrip().startswith("#"))


def split_declaration(text: str):
    """("const char *const *", "packages") from "const char *const *packages"."""
    match = re.fullmatch(r"\s*(.*?[\s*])(\w+)\s*", text)
    assert match, f"cannot read the declaration {text!r}"
    return " ".join(match.group(1).split()), match.group(2)


def functions(header: str):
    """Every function the header declares: name -> (result type, [(type, name)])."""
    declared = {}
    pattern = r"([A-Za-z_][\w\s*]*?)\b(prepare_\w+)\s*\(([^)]*)\)\s*;"
    for result, name, parameters in re.findall(pattern, without_comments(header)):
        parameters = parameters.strip()
        listed = [] if parameters in ("", "void") else parameters.split(",")
        declared[name] = (" ".join(result.split()), [split_declaration(p) for p in listed])
    return declared


def struct_fields(header: str, name: str):
    match = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name),
                      without_comments(header), flags=re.S)
    assert match, f"the header has no struct {name}"
    return [split_declaration(field) for field in match.group(1).split(";") if field.strip()]


def enum_values(header: str, name: str):
    match = re.search(r"typedef enum %s \{(.*?)\} %s;" % (name, name),
                      without_comments(header), flags=re.S)
    assert match, f"the header has no enum {name}"
    values = {}
    for entry in match.group(1).split(","):
        if entry.strip():
            key, value = entry.split("=")
            values[key.strip()] = int(value)
    return values


def type_name(ctype) -> str:
    return getattr(ctype, "__name__", repr(ctype))


STATUS_CLASSES = {
    "PREPARE_STATUS_INVALID_ARGUMENT": "InvalidArgument",
    "PREPARE_STATUS_PACKAGE_REFUSED": "PackageRefused",
    "PREPARE_STATUS_PEER_TIMEOUT": "PeerTimeout",
    "PREPARE_STATUS_RUNTIME_FAILURE": "RuntimeFailure",
    "PREPARE_STATUS_INTERNAL": "InternalError",
}


def differences(header: str):
    """Where the binding's declarations differ from `header`, one line each."""
    found = []
    declared = functions(header)
    for name in sorted(set(declared) - set(_binding._SIGNATURES)):
        found.append(f"{name}: in the header, not in _SIGNATURES")
    for name in sorted(set(_binding._SIGNATURES) - set(declared)):
        found.append(f"{name}: in _SIGNATURES, not in the header")
    for name in sorted(set(declared) & set(_binding._SIGNATURES)):
        (result, parameters), (arguments, restype) = declared[name], _binding._SIGNATURES[name]
        if ctype_of(result) is not restype:
            found.append(f"{name}: returns {result}, _SIGNATURES says {type_name(restype)}")
        if len(parameters) != len(arguments):
            found.append(f"{name}: {len(parameters)} parameters, _SIGNATURES has "
                         f"{len(arguments)}")
            continue
        for (c_type, parameter), argument in zip(parameters, arguments):
            if ctype_of(c_type) is not argument:
                found.append(f"{name}: {parameter} is {c_type}, _SIGNATURES says "
                             f"{type_name(argument)}")

    fields = struct_fields(header, "PrepareOptions")
    ours = [(name, ctype) for name, ctype in _binding._Options._fields_]
    if [name for _, name in fields] != [name for name, _ in ours]:
        found.append(f"PrepareOptions has fields {[name for _, name in fields]}, _Options "
                     f"{[name for name, _ in ours]}")
    else:
        for (c_type, name), (_, ctype) in zip(fields, ours):
            if ctype_of(c_type) is not ctype:
                found.append(f"PrepareOptions.{name} is {c_type}, _Options says "
                             f"{type_name(ctype)}")

    statuses = enum_values(header, "PrepareStatus")
    expected = {key: value for key, value in statuses.items() if value != 0}
    classes = {key: getattr(_binding, cls).status for key, cls in STATUS_CLASSES.items()}
    if expected != classes or set(expected.values()) != set(_binding._ERRORS):
        found.append(f"PrepareStatus is {statuses}, the exception classes say {classes}")
    dtypes = {key[len("PREPARE_DTYPE_"):].lower(): value
              for key, value in enum_values(header, "PrepareDtype").items()}
    if dtypes != _binding.DTYPE_CODES:
        found.append(f"PrepareDtype is {dtypes}, DTYPE_CODES {_binding.DTYPE_CODES}")
    tunings = {key[len("PREPARE_TUNING_"):].lower(): value
               for key, value in enum_values(header, "PrepareTuning").items()}
    if tunings != _binding.TUNINGS:
        found.append(f"PrepareTuning is {tunings}, TUNINGS {_binding.TUNINGS}")
    size = re.search(r"#define PREPARE_UNIQUE_ID_BYTES (\d+)", header)
    if size is None or int(size.group(1)) != _binding.UNIQUE_ID_BYTES:
        found.append(f"PREPARE_UNIQUE_ID_BYTES is {size and size.group(1)}, UNIQUE_ID_BYTES "
                     f"{_binding.UNIQUE_ID_BYTES}")
    return found


def test_the_binding_declares_what_the_generated_header_declares(header):
    assert functions(header), "no function read from the header"
    assert differences(header) == []


def replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} is not in the header once"
    return text.replace(old, new)


@pytest.mark.parametrize(
    "old, new, reported",
    [
        ("uint32_t rank,\n                                          uint32_t world",
         "uint64_t rank,\n                                          uint32_t world",
         "prepare_open_unique_id: rank is uint64_t, _SIGNATURES says c_uint"),
        ("enum PrepareStatus prepare_check(const struct PrepareHandle *handle);",
         "enum PrepareStatus prepare_check(const struct PrepareHandle *handle, int32_t flags);",
         "prepare_check: 2 parameters, _SIGNATURES has 1"),
        ("enum PrepareStatus prepare_close(struct PrepareHandle *handle);",
         "enum PrepareStatus prepare_close(struct PrepareHandle *handle);\n"
         "enum PrepareStatus prepare_reopen(struct PrepareHandle *handle);",
         "prepare_reopen: in the header, not in _SIGNATURES"),
        ("const char *prepare_version(void);", "",
         "prepare_version: in _SIGNATURES, not in the header"),
        ("const char *prepare_last_error(void);", "int32_t prepare_last_error(void);",
         "prepare_last_error: returns int32_t, _SIGNATURES says c_char_p"),
        ("  double timeout_seconds;\n", "  float timeout_seconds;\n",
         "PrepareOptions.timeout_seconds is float, _Options says c_double"),
        ("  size_t package_count;\n", "  size_t package_count;\n  size_t cache_count;\n",
         "PrepareOptions has fields"),
        ("  int32_t retune;\n", "  uint64_t retune;\n",
         "PrepareOptions.retune is uint64_t, _Options says c_int"),
        ("PREPARE_STATUS_INTERNAL = 5", "PREPARE_STATUS_INTERNAL = 6", "PrepareStatus is"),
        ("PREPARE_DTYPE_FP32 = 2", "PREPARE_DTYPE_FP32 = 3", "PrepareDtype is"),
        ("PREPARE_TUNING_STATIC = 1", "PREPARE_TUNING_STATIC = 2", "PrepareTuning is"),
        ("#define PREPARE_UNIQUE_ID_BYTES 128", "#define PREPARE_UNIQUE_ID_BYTES 256",
         "PREPARE_UNIQUE_ID_BYTES is 256"),
    ],
    ids=["argument-type", "argument-count", "new-function", "missing-function", "result-type",
         "field-type", "new-field", "field-width", "status", "dtype", "tuning",
         "unique-id"],
)
def test_a_header_that_differs_from_the_binding_is_reported(header, old, new, reported):
    found = differences(replaced(header, old, new))
    assert any(reported in line for line in found), found
