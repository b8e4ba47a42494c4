"""`parsed_once`: inside it a GGUF file is parsed once and gguf's tensor-name table built once;
outside it gguf is left as it was (a small GGUF file written here with gguf's own writer)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from infra.gguf_files import parsed_once


def small_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_is_parsed_once_inside_and_gguf_is_itself_again_after(tmp_path: Path) -> None:
    path = small_gguf(tmp_path / "small.gguf")
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is first and first.tensors[0].name == "token_embd.weight"
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not first  # a fresh parse again
