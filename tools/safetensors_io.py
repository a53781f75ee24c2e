"""Minimal safetensors writer and reader (Debian's torch 1.13 has no safetensors package).

Format: u64 little-endian header length, JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
{str: str}} padded with spaces to a multiple of 8 bytes, then the raw little-endian tensor bytes.
"""

import json
import struct

import torch

_DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16"}
_TORCH = {"F32": torch.float32, "I32": torch.int32, "BF16": torch.bfloat16}


def save(path, tensors, metadata):
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        flat = tensor.detach().contiguous().cpu()
        # numpy has no bfloat16: its 16 bits as int16
        data = (flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat).numpy().tobytes()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {key: str(value) for key, value in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for chunk in chunks:
            out.write(chunk)


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + length:]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=_TORCH[entry["dtype"]])
        tensors[name] = flat.reshape(entry["shape"])
    return tensors, metadata
