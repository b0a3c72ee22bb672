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
    return parse_json_object(path.read_bytes(), path, what, fix)


def parse_json_object(data: bytes | str, where: object, what: str, fix: str) -> dict:
    """The JSON object in `data`, read from `where` (a path or URL, for the errors): a torn,
    empty, binary or wrong-kind file is a ValueError naming `where` and `fix`."""
    try:
        value = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for binary garbage
        raise ValueError(f"{where}: {what} is not valid JSON ({exc}): {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {what} holds a JSON {type(value).__name__}, not an object ({{...}}): {fix}")
    return value


SAFETENSORS_FIX = "re-export the drafter, or copy the file again"


# Bits per element of every dtype the safetensors format defines; any other is refused.
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}


def read_safetensors_header(path: str | Path, fix: str = SAFETENSORS_FIX) -> dict[str, dict]:
    """Tensor names, dtypes and shapes from a safetensors file, without reading the data.

    The format: an 8-byte little-endian header length, that many bytes of JSON, then the data.
    The length is checked against the file's size before anything is read, and the tensors'
    data against the bytes that follow: each dtype must be one the format defines, each tensor's
    extent must hold its dtype and shape, and together they must cover the data exactly, as the
    safetensors library itself demands. So a garbage, truncated or extended file is named as
    such, with `fix`, before any parser sees it."""
    return read_safetensors_layout(path, fix)[0]


def read_safetensors_layout(path: str | Path, fix: str = SAFETENSORS_FIX) -> tuple[dict[str, dict], int]:
    """`read_safetensors_header`'s header, and the byte offset where the data begin (8 + the
    header's length): tensor `name` lies at that offset + its `data_offsets`."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_bytes = int.from_bytes(prefix, "little")
        if len(prefix) < 8 or header_bytes > size - 8:
            raise ValueError(
                f"{path}: not a safetensors file, or truncated (its first 8 bytes announce a {header_bytes}-byte header in a {size}-byte file): {fix}"
            )
        try:
            header = json.loads(f.read(header_bytes))
        except ValueError as exc:
            raise ValueError(f"{path}: not a safetensors file (its header is not JSON: {exc}): {fix}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (its header is not a JSON object): {fix}")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - header_bytes
    extents = []
    for name, entry in header.items():
        if not (isinstance(entry, dict) and _is_shape(entry.get("shape")) and _is_offsets(entry.get("data_offsets"))):
            raise ValueError(f"{path}: not a safetensors file (tensor {name!r} has no valid shape or data offsets): {fix}")
        begin, end = entry["data_offsets"]
        if end > data_bytes:
            raise ValueError(
                f"{path}: truncated: tensor {name!r} ends {end} bytes into the data, the file holds {data_bytes} after its header: {fix}"
            )
        bits = SAFETENSORS_DTYPE_BITS.get(entry.get("dtype"))
        if bits is None:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {entry.get('dtype')!r}, which is not a safetensors dtype "
                f"(those are {', '.join(SAFETENSORS_DTYPE_BITS)}): {fix}"
            )
        if math.prod(entry["shape"]) * bits != (end - begin) * 8:
            raise ValueError(
                f"{path}: tensor {name!r} ({entry['dtype']}, shape {entry['shape']}) takes {end - begin} bytes, "
                f"its shape needs {math.prod(entry['shape']) * bits / 8:g}: {fix}"
            )
        extents.append((begin, end))
    covered = 0
    for begin, end in sorted(extents):
        if begin != covered:
            break
        covered = end
    if covered != data_bytes:
        raise ValueError(
            f"{path}: the tensors' data cover {covered} of the {data_bytes} bytes after the header (bytes appended, overlapping or missing): {fix}"
        )
    return header, 8 + header_bytes


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


def _is_offsets(offsets) -> bool:
    return (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    )
