"""Reading the JSON and safetensors files that users and stages hand us, checked.

A corrupt, truncated or wrong-kind file is a ValueError that names the file and the fix; the
command line shows ValueErrors as one message. Left to the parsers, the same file surfaces as a
traceback ("Expecting value: line 2 column 1", "'list' object has no attribute 'get'", or a
MemoryError from eight bytes of garbage read as a header length) with no file named.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def read_json_object(path: str | Path, what: str, fix: str) -> dict:
    """The JSON object (`{...}`) in `path`. `what` names the file in errors ("the drafter's
    config"), `fix` says what to do about a bad one ("re-export the drafter")."""
    path = Path(path)
    try:
        value = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for binary garbage
        raise ValueError(f"{path}: {what} is not valid JSON ({exc}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: {what} holds a JSON {type(value).__name__}, not an object ({{...}}): {fix}")
    return value


SAFETENSORS_FIX = "re-export the drafter, or copy the file again"
# The dtypes the safetensors format defines, with their bits per element.
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}  # fmt: skip


def read_safetensors_header(path: str | Path) -> dict[str, dict]:
    """Tensor names, dtypes and shapes from a safetensors file, without reading the data.

    The format: an 8-byte little-endian header length, that many bytes of JSON, then the data.
    The length is checked against the file's size before anything is read, and each tensor's
    data against the bytes that follow, so a garbage or truncated file is named as such; each
    dtype must be one the format defines and fill its tensor's bytes exactly."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_bytes = int.from_bytes(prefix, "little")
        if len(prefix) < 8 or header_bytes > size - 8:
            raise ValueError(
                f"{path}: not a safetensors file, or truncated (its first 8 bytes announce a {header_bytes}-byte "
                f"header in a {size}-byte file): {SAFETENSORS_FIX}"
            )
        try:
            header = json.loads(f.read(header_bytes))
        except ValueError as exc:
            raise ValueError(f"{path}: not a safetensors file (its header is not JSON: {exc}): {SAFETENSORS_FIX}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is not a JSON object): {SAFETENSORS_FIX}")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - header_bytes
    for name, entry in header.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("shape"), list) and _offsets_fit(entry.get("data_offsets"), data_bytes)):
            raise ValueError(
                f"{path}: tensor {name!r} has no shape, or its data lies past the end of the file "
                f"(truncated?): {SAFETENSORS_FIX}"
            )
        bits = SAFETENSORS_DTYPE_BITS.get(entry.get("dtype"))
        if bits is None:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {entry.get('dtype')!r}, which is not a safetensors dtype "
                f"(those are {', '.join(SAFETENSORS_DTYPE_BITS)}): {SAFETENSORS_FIX}"
            )
        start, end = entry["data_offsets"]
        if not all(isinstance(d, int) and d >= 0 for d in entry["shape"]) or math.prod(entry["shape"]) * bits != (end - start) * 8:
            raise ValueError(
                f"{path}: tensor {name!r} ({entry['dtype']}, shape {entry['shape']}) does not fill its {end - start} bytes: "
                f"{SAFETENSORS_FIX}"
            )
    return header


def _offsets_fit(offsets, data_bytes: int) -> bool:
    return (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    )
