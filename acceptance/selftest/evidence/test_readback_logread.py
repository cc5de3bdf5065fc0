"""What the log reader (harness.evidence.logread) reports, read back field by field, and its line splitting at its edges.

Written from the survivors of a mutation run of logread.py (results/mutation/logread-3b62a32/): every note of
ReadInfo.notes() read back with its exact words (they are shown in the grade), every ReadInfo field set by a real
file of that shape, undecodable bytes and a multi-byte character cut at the end of the file, chunk edges (a line
split across chunks, a cut line continuing into the next chunk, an empty chunk), the CR-only threshold (two bare
\\r without a \\n), the file read in bounded chunks, the ranks a rank-less wrapping or a per-rank file gives.
"""

from __future__ import annotations

import codecs
import gzip

import pytest

from harness.evidence import logread

CAP = logread.MAX_LINE_CHARS


def read(path, **kw) -> tuple[list, logread.ReadInfo]:
    info = logread.ReadInfo(str(path))
    return list(logread.read_lines(path, info)), info


# ---------------------------------------------------------------- notes, word for word


def test_every_note_read_back_in_order():
    info = logread.ReadInfo("/x/train.log", encoding="utf-16-le", bom=True, compressed="gzip", crlf_lines=3,
                            cr_only=True, cut_lines=2, wrappers=("iso-timestamp", "torchrun-prefix"),
                            stopped="the gzip stream is cut short")
    assert info.notes() == [
        "train.log: gzip-compressed, read decompressed",
        "train.log: encoding UTF-16-LE (byte-order mark)",
        "train.log: Windows line endings (CRLF) on 3 lines",
        "train.log: lines end in a carriage return alone (CR), read as line ends",
        "train.log: ISO timestamps, rank prefixes ([default0]: / [rank0]:) taken off each line",
        f"train.log: 2 lines over {CAP} characters cut",
        "train.log: the gzip stream is cut short",
    ]


def test_plain_utf8_log_has_no_note_and_an_encoding_without_bom_says_so():
    assert logread.ReadInfo("a.log").notes() == []
    assert logread.ReadInfo("a.log", encoding="utf-16-be").notes() == ["a.log: encoding UTF-16-BE"]
    assert logread.ReadInfo("a.log", bom=True).notes() == ["a.log: encoding UTF-8 (byte-order mark)"]


@pytest.mark.parametrize("codec,bom", [("utf-8", codecs.BOM_UTF8), ("utf-16-le", codecs.BOM_UTF16_LE),
                                       ("utf-16-be", codecs.BOM_UTF16_BE), ("utf-32-le", codecs.BOM_UTF32_LE)])
def test_a_bom_sets_encoding_and_bom(tmp_path, codec, bom):
    path = tmp_path / "t.log"
    path.write_bytes(bom + "a\nb\n".encode(codec))
    lines, info = read(path)
    assert lines == ["a", "b"] and info.encoding == codec and info.bom is True


# ---------------------------------------------------------------- bytes that do not decode


def test_undecodable_bytes_are_replaced_never_fatal(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b"ok\nbad \xff\xfe here\nend\n")
    lines, _ = read(path)
    assert lines == ["ok", "bad \ufffd\ufffd here", "end"]


def test_a_multibyte_character_cut_at_the_end_is_one_replacement(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b"ok\nprice 5 \xe2\x82")            # the euro sign's first two bytes, no newline
    lines, info = read(path)
    assert lines == ["ok", "price 5 \ufffd"] and info.truncated_last_line is True


def test_read_without_a_readinfo(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    assert list(logread.read_lines(path)) == ["a", "b"]
    assert "".join(logread.decoded_chunks(path)) == "a\nb\n"


def test_the_file_is_read_in_bounded_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "CHUNK_BYTES", 64)
    path = tmp_path / "t.log"
    path.write_bytes(b"0123456789\n" * 100)
    chunks = list(logread.decoded_chunks(path))
    assert "".join(chunks) == "0123456789\n" * 100
    assert len(chunks) >= 1100 // 64 and max(map(len, chunks)) <= 64


def test_a_stopped_reader_reads_nothing_more(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(gzip.compress(b"a\nb\n"))
    info = logread.ReadInfo(str(path), stopped="stopped before")
    assert list(logread.decoded_chunks(path, info)) == []


def test_a_cut_gzip_stream_gives_a_prefix_and_says_so(tmp_path):
    text = "".join(f"line {i}\n" for i in range(20000))
    data = gzip.compress(text.encode())
    path = tmp_path / "t.log.gz"
    path.write_bytes(data[: len(data) // 2])
    lines, info = read(path)
    got = "\n".join(lines)
    assert info.stopped and "cut short or corrupt" in info.stopped and text.startswith(got) and len(lines) > 10


def test_the_cap_message_names_the_cap_in_gib(monkeypatch):
    """The stop note at the real cap (2 GiB), reached by a stream that says it is that far in."""

    class FarIn:
        def tell(self):
            return logread.MAX_DECOMPRESSED_BYTES

        def read1(self, n):
            raise AssertionError("read past the cap")

    info = logread.ReadInfo("big.log.gz", compressed="gzip")
    assert logread._read(FarIn(), info) == b""
    assert info.stopped == f"decompressed text over {logread.MAX_DECOMPRESSED_BYTES >> 30} GiB: read no further"
    assert "over 2 GiB" in info.stopped


def test_over_the_cap_reading_stops_exactly_at_a_chunk_multiple_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(logread, "CHUNK_BYTES", 256)
    monkeypatch.setattr(logread, "MAX_DECOMPRESSED_BYTES", 4096)
    text = ("z" * 99 + "\n") * 100
    path = tmp_path / "t.log"
    path.write_bytes(gzip.compress(text.encode()))
    lines, info = read(path)
    assert "\n".join(lines) == text[:4096] and info.stopped


# ---------------------------------------------------------------- line splitting at chunk edges


def split(chunks) -> tuple[list, logread.ReadInfo]:
    info = logread.ReadInfo("(chunks)")
    return list(logread.split_lines(chunks, info)), info


def test_a_line_split_across_chunks_and_an_empty_chunk():
    lines, info = split(["ab", "", "cd\ne", "f\n", "", "g\n"])
    assert lines == ["abcd", "ef", "g"] and info.truncated_last_line is False


def test_truncated_last_line_is_reset_per_read():
    info = logread.ReadInfo("(chunks)", truncated_last_line=True)
    assert list(logread.split_lines(["a\n"], info)) == ["a"] and info.truncated_last_line is False
    assert list(logread.split_lines(["a\nb"], info)) == ["a", "b"] and info.truncated_last_line is True


def test_a_cut_line_drops_its_rest_in_the_next_chunks_and_counts_once_each():
    lines, info = split(["x" * (CAP + 10), "yyy", "yyy\nnext\n", "w" * (CAP + 1) + "\nlast\n"])
    assert lines == ["x" * CAP, "next", "w" * CAP, "last"] and info.cut_lines == 2


def test_two_lines_cut_at_chunk_ends_count_two():
    """Both over the cap within their chunk (the pending-line branch), each counted."""
    lines, info = split(["x" * (CAP + 10), "\n", "y" * (CAP + 5), "\nend\n"])
    assert lines == ["x" * CAP, "y" * CAP, "end"] and info.cut_lines == 2


def test_a_line_of_exactly_the_cap_split_at_a_chunk_edge_is_not_cut():
    lines, info = split(["x" * CAP, "\nnext\n"])
    assert lines == ["x" * CAP, "next"] and info.cut_lines == 0
    lines, info = split(["x" * (CAP + 1), "\nnext\n"])
    assert lines == ["x" * CAP, "next"] and info.cut_lines == 1


@pytest.mark.parametrize("count,cr_only", [(0, False), (1, False), (2, True), (3, True)])
def test_cr_only_needs_at_least_two_bare_carriage_returns(count, cr_only):
    text = "".join(f"l{i}\r" for i in range(count)) + "tail"
    lines, info = split([text])
    assert info.cr_only is cr_only
    assert lines == ([f"l{i}" for i in range(count)] + ["tail"] if cr_only else [text])


def test_a_last_line_without_newline_loses_its_windows_cr():
    lines, info = split(["a\r\nb\r"])
    assert lines == ["a", "b"] and info.crlf_lines == 2 and info.truncated_last_line is True


# ---------------------------------------------------------------- wrappers and ranks


def test_leading_blank_lines_do_not_stop_detection():
    lines = ["", "   ", "[rank0]:a", "[rank0]:b", "plain"]
    assert logread.detect_wrappers(lines) == ("torchrun-prefix",)


def test_the_line_after_the_detection_window_is_not_counted():
    """One wrapped line, 254 blank ones, two plain: the first 256 lines hold 1 wrapped of 2 non-blank (detected);
    counting line 257 too would make it 1 of 3."""
    lines = ["[rank0]:a"] + [""] * 254 + ["plain 1", "plain 2"]
    info = logread.ReadInfo("(text)")
    out = list(logread.unwrap(iter(lines), info))
    assert info.wrappers == ("torchrun-prefix",) and out[0] == ((0,), "a") and len(out) == len(lines)


def test_ranks_from_prefixes_from_a_per_rank_file_and_none_from_timestamps():
    info = logread.ReadInfo("(text)")
    out = list(logread.unwrap(iter(["[rank0]:a", "[rank1]:b"]), info))
    assert out == [((0,), "a"), ((1,), "b")] and info.ranks == {(0,), (1,)}

    info = logread.ReadInfo("(text)")
    out = list(logread.unwrap(iter(["plain a", "plain b"]), info, rank=(3,)))
    assert out == [((3,), "plain a"), ((3,), "plain b")] and info.ranks == {(3,)}

    info = logread.ReadInfo("(text)")
    out = list(logread.unwrap(iter(["[14:17:59] a", "[14:18:00] b"]), info))
    assert out == [(None, "a"), (None, "b")] and info.ranks == set() and info.wrappers == ("clock-stamp",)

    info = logread.ReadInfo("(text)")
    assert list(logread.unwrap(iter(["plain"]), info)) == [(None, "plain")] and info.ranks == set()
