"""Reading a training log as real tools write it: a stream of decoded lines, with the launcher's wrapping removed.

A log reaches the grader in many shapes besides Megatron's own stdout: compressed (``*.log.gz``, recognised by
its magic bytes, whatever the name), in UTF-16 or with a byte-order mark (recognised by the BOM; no BOM means
UTF-8), with Windows line endings, and with every line wrapped by the tool that captured it: a rank prefix from
the launcher (torchrun ``--tee`` writes ``[default0]:``, PyTorch ``[rank0]:``, ``srun --label`` writes ``0: ``)
or a timestamp (``2026-11-29T14:17:59.537Z ``, ``[14:17:59] ``). Several ranks may be interleaved in one file.

``read_lines`` is a generator of decoded lines (bounded memory: the file is read in chunks, a line longer than
MAX_LINE_CHARS is cut); ``unwrap`` is a second generator that takes the wrapping off and tells each line's rank.
Both fill a ``ReadInfo`` that says, in words, what was done (the grade shows it). Wrappings are recognised on the
first lines of a file (a style counts when at least half of them carry it), so a single ``[rank0]:`` warning
inside a plain Megatron log is left as written.
"""

from __future__ import annotations

import codecs
import gzip
import zlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from harness.base import paths

CHUNK_BYTES = 1 << 20
MAX_LINE_CHARS = 1 << 13              # the longest line of the 13 recorded Megatron-LM logs is 1,385 characters;
                                       # longer ones are cut (and counted): a hostile log of 64K-character lines
                                       # costs what 8K-character ones do, never more
DETECT_LINES = 256                    # lines looked at to recognise a file's wrapping
GZIP_MAGIC = b"\x1f\x8b"
# (BOM, codec), longest first: a UTF-32 LE BOM starts with the UTF-16 LE one.
BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
        (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))

# One wrapping each: anchored, no nested quantifiers (linear on any input). Rank styles name the rank's digits.
WRAPPERS = {
    "torchrun-prefix": re.compile(r"\[(?:[A-Za-z_][\w-]{0,63}?)?(?P<rank>\d{1,6})\]:"),   # [default0]: [rank0]:
    "srun-label": re.compile(r" {0,8}(?P<rank>\d{1,6}): "),                               # srun --label
    "iso-timestamp": re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? "),
    "datetime-stamp": re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,9})? "),     # ts '%F %T'
    "clock-stamp": re.compile(r"\[\d\d:\d\d:\d\d(?:[.,]\d{1,9})?\] "),                     # ts '[%T]'
}
WRAPPER_WORDS = {"torchrun-prefix": "rank prefixes ([default0]: / [rank0]:)", "srun-label": "srun --label prefixes (0: )",
                 "iso-timestamp": "ISO timestamps", "datetime-stamp": "timestamps", "clock-stamp": "[HH:MM:SS] timestamps"}
MAX_WRAPPERS = 4                      # e.g. a timestamp, then srun's label, then torchrun's prefix


@dataclass
class ReadInfo:
    """What reading one file (or one stream of files) found and did; filled while its generators run."""

    path: str
    encoding: str = "utf-8"
    bom: bool = False
    compressed: str | None = None     # "gzip"
    crlf_lines: int = 0
    cr_only: bool = False             # lines end in a bare \r (no \n in the first chunk): classic Mac endings
    cut_lines: int = 0                # lines longer than MAX_LINE_CHARS, cut
    truncated_last_line: bool = False
    wrappers: tuple = ()              # WRAPPERS keys found on this file's lines
    ranks: set = field(default_factory=set)
    stopped: str | None = None        # why reading stopped before the end (a cut gzip stream, a decompression cap)

    def notes(self) -> list:
        """Plain sentences for the grade; empty for a plain UTF-8 Megatron log."""
        name, out = Path(self.path).name, []
        if self.compressed:
            out.append(f"{name}: {self.compressed}-compressed, read decompressed")
        if self.encoding != "utf-8" or self.bom:
            out.append(f"{name}: encoding {self.encoding.upper()}" + (" (byte-order mark)" if self.bom else ""))
        if self.crlf_lines:
            out.append(f"{name}: Windows line endings (CRLF) on {self.crlf_lines} lines")
        if self.cr_only:
            out.append(f"{name}: lines end in a carriage return alone (CR), read as line ends")
        if self.wrappers:
            out.append(f"{name}: {', '.join(WRAPPER_WORDS[w] for w in self.wrappers)} taken off each line")
        if self.cut_lines:
            out.append(f"{name}: {self.cut_lines} lines over {MAX_LINE_CHARS} characters cut")
        if self.stopped:
            out.append(f"{name}: {self.stopped}")
        return out


def _bom(head: bytes) -> tuple:
    """(codec, BOM length): by byte-order mark; UTF-8 without one."""
    for mark, codec in BOMS:
        if head.startswith(mark):
            return codec, len(mark)
    return "utf-8", 0


def _binary(path: Path, raw):
    """The file's bytes, decompressed when they start with gzip's magic (whatever the file's name)."""
    head = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw, mode="rb") if head == GZIP_MAGIC else raw


MAX_DECOMPRESSED_BYTES = 2 << 30     # a gzip log is read up to 2 GiB of text (a 'zip bomb' stops there)


def _read(stream, info: ReadInfo) -> bytes:
    """The next chunk; b"" at the end, or where a compressed stream is cut short or too large (info.stopped says
    which: the lines before are still judged, never an exception)."""
    if info.stopped:
        return b""
    if info.compressed and stream.tell() >= MAX_DECOMPRESSED_BYTES:
        info.stopped = f"decompressed text over {MAX_DECOMPRESSED_BYTES >> 30} GiB: read no further"
        return b""
    try:
        # read1: what one decompression step gives, so a cut stream loses only its last piece, not a whole chunk
        return stream.read1(CHUNK_BYTES) if info.compressed else stream.read(CHUNK_BYTES)
    except (EOFError, OSError, zlib.error) as exc:   # gzip.BadGzipFile is an OSError
        info.stopped = f"the gzip stream is cut short or corrupt ({exc}): the lines before were read"
        return b""


def decoded_chunks(path: str | Path, info: ReadInfo | None = None) -> Iterator[str]:
    """The file's text in chunks, decoded by its BOM (undecodable bytes replaced, never fatal)."""
    info = info if info is not None else ReadInfo(str(path))
    with paths.open_inside(Path(path).parent, Path(path).name) as raw:   # no link followed, a regular file only
        stream = _binary(Path(path), raw)
        if stream is not raw:
            info.compressed = "gzip"
        data = _read(stream, info)
        info.encoding, skip = _bom(data)
        info.bom = skip > 0
        decoder = codecs.getincrementaldecoder(info.encoding)(errors="replace")
        data = data[skip:]
        while data:
            text = decoder.decode(data)
            if text:
                yield text
            data = _read(stream, info)
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail


def split_lines(chunks: Iterable[str], info: ReadInfo) -> Iterator[str]:
    """Lines (without their \\n, a CRLF's \\r taken off) from text chunks; the last line is yielded even without
    its newline, and info.truncated_last_line says so. A \\r inside a line (progress bars) is kept, unless the
    first chunk has no \\n at all and several \\r: then the \\r is the line end (classic Mac endings)."""
    pending, cutting, end = "", False, None
    info.truncated_last_line = False
    for chunk in chunks:
        if not chunk:
            continue
        if end is None:
            info.cr_only = "\n" not in chunk and chunk.count("\r") > 1
            end = "\r" if info.cr_only else "\n"
        pieces = chunk.split(end)
        for piece in pieces[:-1]:
            line, pending = (pending if cutting else pending + piece), ""
            if not cutting and len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS]
                info.cut_lines += 1
            cutting = False
            yield _finish(line, info)
        if not cutting:
            pending += pieces[-1]
            if len(pending) > MAX_LINE_CHARS:
                pending, cutting = pending[:MAX_LINE_CHARS], True
                info.cut_lines += 1
    if pending:
        info.truncated_last_line = True
        yield _finish(pending, info)


def _finish(line: str, info: ReadInfo) -> str:
    """One line: a Windows CR taken off (and counted)."""
    if line.endswith("\r"):
        info.crlf_lines += 1
        return line[:-1]
    return line


def read_lines(path: str | Path, info: ReadInfo | None = None) -> Iterator[str]:
    """The decoded lines of a log file, streamed (see split_lines)."""
    info = info if info is not None else ReadInfo(str(path))
    return split_lines(decoded_chunks(path, info), info)


def text_lines(text: str, info: ReadInfo) -> Iterator[str]:
    """The same lines from text already in memory."""
    return split_lines([text], info)


def _strip(line: str, styles) -> tuple:
    """(line without its wrappers, rank digits found outer to inner, styles found). Each style comes off once: in
    `[default0]:[rank0]:[W1129 ...` the second prefix is PyTorch's own text, printed by that rank."""
    ranks, found = [], []
    for _ in range(MAX_WRAPPERS):
        for name in styles:
            if name in found:
                continue
            m = WRAPPERS[name].match(line)
            if m:
                if "rank" in m.groupdict():
                    ranks.append(int(m["rank"]))
                found.append(name)
                line = line[m.end():]
                break
        else:
            break
    return line, tuple(ranks), found


def detect_wrappers(lines: list) -> tuple:
    """The wrapping styles that at least half of these lines carry, outermost first."""
    counts, order, nonempty = {}, [], 0
    for line in lines:
        if not line.strip():
            continue
        nonempty += 1
        for name in dict.fromkeys(_strip(line, WRAPPERS)[2]):
            counts[name] = counts.get(name, 0) + 1
            if name not in order:
                order.append(name)
    return tuple(n for n in order if nonempty and counts[n] * 2 >= nonempty)


def unwrap(lines: Iterable[str], info: ReadInfo, rank: tuple | None = None) -> Iterator[tuple]:
    """(rank, line) for every line, the file's wrapping taken off. rank is a tuple of the rank numbers the prefixes
    named (srun's, then torchrun's), the given `rank` for a file that is one rank's (torchrun --log-dir), or None."""
    it = iter(lines)
    head = []
    for line in it:
        head.append(line)
        if len(head) >= DETECT_LINES:
            break
    info.wrappers = detect_wrappers(head)
    styles = info.wrappers

    if rank is not None:
        info.ranks.add(rank)

    def one(line: str) -> tuple:
        if not styles:
            return rank, line
        text, ranks, _ = _strip(line, styles)
        got = ranks or rank
        if got is not None:
            info.ranks.add(got)
        return got, text

    for line in head:
        yield one(line)
    for line in it:
        yield one(line)
