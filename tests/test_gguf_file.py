"""Our GGUF header reader against gguf's GGUFReader, and its errors on broken files."""

import os
import re

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from rooftop.errors import ModelLoadError, UnsupportedModelError
from rooftop.loading.gguf_file import read_gguf, release_pages


def assert_same_as_gguf_reader(path):
    ours = read_gguf(path)
    reader = GGUFReader(path)
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == expected
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(ours.tensors, reader.tensors, strict=False):
        assert mine.qtype == theirs.tensor_type
        assert mine.shape == tuple(int(n) for n in reversed(theirs.shape.tolist()))
        assert np.array_equal(mine.data, np.asarray(theirs.data).reshape(-1).view(np.uint8))


def test_tiny_file_reads_like_gguf_reader(tiny_gguf):
    assert_same_as_gguf_reader(tiny_gguf)


@pytest.mark.slow
def test_bundled_file_reads_like_gguf_reader():
    from rooftop.loading.bundled import bundled_model_path

    assert_same_as_gguf_reader(bundled_model_path())


def test_truncated_header(tiny_gguf, tmp_path):
    path = tmp_path / "head.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="truncated GGUF header"):
        read_gguf(path)


def test_a_corrupt_length_is_not_called_truncated(tiny_gguf, tmp_path):
    """The first key's length (after magic, version and the two counts) overwritten with 0xff bytes: no file could
    hold that many, so the header is corrupt, not cut short."""
    data = bytearray(tiny_gguf.read_bytes())
    data[24:32] = b"\xff" * 8
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    message = f"corrupt GGUF header (it gives {2**64 - 1} bytes of data at byte 32, in a file of {len(data)} bytes)"
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        read_gguf(path)


def test_a_vocabulary_cut_short_or_with_a_corrupt_length_says_so(tiny_gguf, tmp_path):
    """Inside a string array (the vocabulary, read in one loop): a file that ends mid-way is truncated, a length no
    file could hold is corrupt, with the byte it was read at."""
    data = tiny_gguf.read_bytes()
    key = b"tokenizer.ggml.tokens"
    first = data.index(key) + len(key) + 4 + 4 + 8  # the value type, the element type, the count
    second = first + 8 + int.from_bytes(data[first : first + 8], "little")
    assert read_gguf(tiny_gguf).metadata["tokenizer.ggml.tokens"][0] == data[first + 8 : second].decode()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: first + 100])
    with pytest.raises(ModelLoadError, match="truncated GGUF header"):
        read_gguf(path)
    path.write_bytes(data[:second] + b"\xff" * 8 + data[second + 8 :])
    message = f"corrupt GGUF header (it gives {2**64 - 1} bytes of data at byte {second + 8}, in a file of {len(data)}"
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        read_gguf(path)


def test_truncated_tensor_data(tiny_gguf, tmp_path):
    path = tmp_path / "body.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:-10])
    with pytest.raises(ModelLoadError, match="truncated: tensor blk.1.ffn_down.weight"):
        read_gguf(path)


@pytest.mark.parametrize("content, message", [(b"", "cannot read as GGUF"), (b"GGML" + bytes(100), "no GGUF magic")])
def test_not_gguf(tmp_path, content, message):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        read_gguf(path)


def test_unknown_version(tiny_gguf, tmp_path):
    data = bytearray(tiny_gguf.read_bytes())
    data[4:8] = (7).to_bytes(4, "little")
    path = tmp_path / "v7.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError, match="GGUF version 7"):
        read_gguf(path)


def test_zero_alignment_is_refused(tmp_path):
    import gguf

    path = tmp_path / "align.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("general.alignment", 0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="invalid general.alignment 0"):
        read_gguf(path)


def mapped_kb(path) -> int:
    """This process's resident kB of its mappings of `path` (Linux's /proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header: address range, perms, offset, dev, inode, path
            inside = fields[-1] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_tensor_read_lets_its_file_pages_go_and_reads_the_same_after(tmp_path):
    """Loading holds each tensor's bytes mapped only while it is read: a mapped page stays resident until the file
    is closed, and the peak of a load was the file beside its converted weights."""
    import gguf

    path = tmp_path / "big.gguf"
    values = np.random.default_rng(0).standard_normal((512, 2048)).astype(np.float32)  # 4 MiB
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = read_gguf(path).tensors[0]
    checksum = float(t.data.view(np.float32).sum())
    assert mapped_kb(path) >= 4000
    release_pages(t)
    assert mapped_kb(path) <= 8  # at most the pages shared with the header
    assert float(t.data.view(np.float32).sum()) == checksum  # read again from the page cache


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_built_model_holds_none_of_the_files_pages(tmp_path):
    """A block format's rows are tiled straight from the file's mapping (no copy), so the pages the tiles were read
    from stay mapped until let go: each layer lets them go once built, and the model holds none at the end."""
    import torch
    from gguf import GGMLQuantizationType as QType
    from gguf_factory import write_tiny_gguf

    from rooftop.loading.gguf import load_gguf
    from rooftop.models.loader import build_model

    path = tmp_path / "q4_k.gguf"
    write_tiny_gguf(path, qtype=QType.Q4_K)
    loaded = load_gguf(path)
    data = sum(t.data.nbytes for t in read_gguf(path).tensors) // 1024
    build_model(loaded, torch.float32, "cpu")
    assert mapped_kb(path) <= 16 < data // 8  # the header's pages at most


def test_a_tensor_the_config_does_not_fit_is_named_as_the_file_names_it(tiny_gguf):
    """A shape mismatch points into the file (`blk.0.ffn_gate.weight`), with the model's name beside it."""
    from rooftop.loading.gguf import load_gguf
    from rooftop.models.loader import build_model

    loaded = load_gguf(tiny_gguf)
    loaded.config.intermediate_size = 512  # the file's ffn matrices are 256 wide
    message = (
        "tensor blk.0.ffn_gate.weight (model.layers.0.mlp.gate_proj.weight) has shape (256, 256), "
        "the config implies (512, 256)"
    )
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        build_model(loaded, torch.float32, "cpu", "float")
