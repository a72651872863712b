"""Real production traces (and any CSV in their format) replayed through the scheduler.

A CSV needs the columns ``timestamp`` (seconds), ``prompt_tokens`` and ``output_tokens``; other columns are
ignored. Arrivals and lengths come from the file. Time is compressed by Little's law so that the offered load
keeps ``concurrency`` sequences busy: ``concurrency / mean output`` arrivals per decode step. Admission then
follows rows and pool capacity, with recompute preemption, so long prompts (Mooncake's) press the pool. The
run lasts until every request in the window has finished; nothing stays live.

Bundled traces (``scenarios/data``, see ATTRIBUTION.md there): Azure LLM inference 2023 (code) and Mooncake
(conversation, FAST 2025). ``azure-code`` and ``mooncake`` give every request its own blocks.

Prefix caching (``prefix_caching``, the ``mooncake-cached`` scenario) needs a hash-id column (``hash_ids``, as in
Mooncake's file): per request, space-separated integer ids of its prompt's ``hash_tokens``-token chunks (512 in
Mooncake), one per chunk, the last one possibly partial; two requests share the id at position ``k`` exactly when
they share the prompt up to the end of chunk ``k``. The chain of ``block_size``-token blocks is derived from them
(:func:`hash_id_chain`): block ``j`` lies in chunk ``k = j * block_size // hash_tokens`` and, while that chunk is
a whole one, its hash is ``block_hash(hash of block j - 1, hash_ids[k], j mod (hash_tokens / block_size))``
(:mod:`scenarios.hashing`). A partial last chunk's blocks, and the blocks decode fills, hold text of that request
alone: their content id is unique to the request. A file without the column, asked for prefix caching, is
refused naming the column and the fix.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from impls.contract import blocks_for

from .files.kinds import NotRegularFileError, read_once
from .hashing import ROOT, UNIQUE, TokenChain, block_hash
from .scheduler import Request, ScenarioError, Scheduler, TraceBuilder
from .trace import Trace

DATA_DIR = Path(__file__).resolve().parent / "data"
COLUMNS = ("timestamp", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class RealTrace:
    description: str
    defaults: dict


_REAL_DEFAULTS = {
    "num_blocks": 65536,
    "block_size": 16,
    "concurrency": 256,
    "start_s": 0.0,
    "duration_s": None,
    "max_blocks_per_seq": 0,  # 0: just enough for the window's longest request
    "step_rate": 2000,
    "max_steps": 100_000,
    "seed": 0,
}
REAL_TRACES = {
    "azure-code": RealTrace(
        "Azure LLM inference trace 2023, code assistant: 8,819 bursty requests, short outputs",
        {**_REAL_DEFAULTS, "csv": "azure_code_2023.csv"}),
    "mooncake": RealTrace(
        "Mooncake conversation trace (FAST 2025), first 5 minutes: long prompts that press the pool",
        {**_REAL_DEFAULTS, "csv": "mooncake_conversation_2025.csv", "duration_s": 300.0}),
    "mooncake-cached": RealTrace(
        "Prefix caching, Mooncake conversation trace, first 2 minutes, with its real hash_ids (one per 512 "
        "tokens; 16-token block chains derived from them, see scenarios/realtrace.py), a 262,144-block pool "
        "(4M tokens, about what an unbounded cache would hit: 11 % of prompt tokens)",
        {**_REAL_DEFAULTS, "num_blocks": 262144, "csv": "mooncake_conversation_2025.csv", "duration_s": 120.0,
         "prefix_caching": True, "hash_tokens": 512}),
}
HASH_COLUMN = "hash_ids"


MAX_TOKENS = 2**31 - 1  # traces keep token counts in int32
MAX_LINE_BYTES = 1 << 20
CHUNK_ROWS = 1 << 16  # rows converted at a time: memory stays at a few numbers per request
_COMPRESSED = {b"\x1f\x8b": "gzip", b"PK\x03\x04": "zip", b"BZh": "bzip2", b"\xfd7zXZ": "xz",
               b"\x28\xb5\x2f\xfd": "zstd"}
_DELIMITERS = {"\t": "tab", ";": "semicolon", "|": "pipe"}


def read_requests_csv(path: str | Path, hash_tokens: int | None = None) -> pd.DataFrame:
    """Read and check a request CSV; errors name the file line and column at fault.

    The file is streamed: memory holds a few numbers per request, not the text. Rows come back sorted by
    arrival, with a ``line`` column (the 1-based line of the file each request came from). With ``hash_tokens``
    (prefix caching) the file must have a ``hash_ids`` column, returned as one int64 array per request. The path
    is opened once: a named pipe (``<(zcat requests.csv.gz)``) is read once into a spool, a device node is
    refused (:func:`scenarios.files.kinds.read_once`).
    """
    path = Path(path)
    if not path.is_absolute() and not path.exists() and (DATA_DIR / path).exists():
        path = DATA_DIR / path
    with _open_csv(path) as fh:
        rows = csv.reader(_decoded_lines(path, fh))
        _header(path, rows)
        fh.seek(0)
        out = _read_fast(fh)
        if out is None:  # something to report (or blank or multi-line rows): the exact, slower reader
            fh.seek(0)
            rows = csv.reader(_decoded_lines(path, fh))
            out = _read_rows(path, rows, _header(path, rows))
        if out.empty:
            raise ScenarioError(f"{path}: no requests (only a header line); add rows of {','.join(COLUMNS)}")
        if hash_tokens is not None:
            fh.seek(0)
            out[HASH_COLUMN] = pd.Series(read_hash_ids(path, fh, out, hash_tokens), index=out.index, dtype=object)
    ts = out["timestamp"].to_numpy()
    if np.all(ts[1:] >= ts[:-1]):
        return out
    return out.sort_values("timestamp", kind="stable").reset_index(drop=True)


def _open_csv(path: Path) -> BinaryIO:
    try:
        fh = read_once(path)
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such CSV file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: is a folder; give a request CSV file") from None
    except NotRegularFileError as exc:
        raise ScenarioError(f"{path}: {exc.strerror}") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the CSV file ({exc.strerror or exc})") from None
    magic = fh.read(8)
    fh.seek(0)
    for prefix, kind in _COMPRESSED.items():
        if magic.startswith(prefix):
            fh.close()
            how = f" (`gunzip -c {path} > requests.csv`, or --from-csv <(gunzip -c {path}))" if kind == "gzip" else ""
            raise ScenarioError(f"{path}: is a {kind}-compressed file, not CSV text; decompress it first{how}")
    return fh


def _decoded_lines(path: Path, fh: BinaryIO) -> Iterator[str]:
    """The file's lines as text; a line that is not UTF-8 or is absurdly long fails naming its number."""
    number = 0
    while raw := fh.readline(MAX_LINE_BYTES):
        number += 1
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise ScenarioError(f"{path}: line {number} is longer than {MAX_LINE_BYTES} bytes: not a request CSV")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScenarioError(f"{path}: line {number}, byte {exc.start + 1} of the line: 0x{raw[exc.start]:02x} is "
                                "not UTF-8 text; save the file as UTF-8") from None
        yield line.lstrip("\ufeff") if number == 1 else line


def _header(path: Path, rows: Iterator[list[str]]) -> tuple[int, list[int]]:
    """The header line: (number of fields, index of each needed column)."""
    try:
        header = [name.strip() for name in next(rows)]
    except StopIteration:
        raise ScenarioError(f"{path}: empty file; a request CSV starts with the header line "
                            f"{','.join(COLUMNS)}") from None
    except csv.Error as exc:
        raise ScenarioError(f"{path}: line 1: not CSV ({exc})") from None
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        hint = next((f" (the header looks {kind}-separated: a request CSV is comma-separated)"
                     for sep, kind in _DELIMITERS.items() if len(header) == 1 and sep in header[0]), "")
        raise ScenarioError(f"{path}: line 1: missing column(s) {missing}; a request CSV needs {list(COLUMNS)} "
                            f"in a comma-separated header line{hint}")
    return len(header), [header.index(c) for c in COLUMNS]


def _read_fast(fh: BinaryIO) -> pd.DataFrame | None:
    """pandas' C parser, in chunks, into preallocated columns; None unless every value is valid and each row is
    one line of the file (then line numbers are exact without looking at the text again)."""
    n = _count_lines(fh) - 1
    fh.seek(0)
    cols = {"timestamp": np.empty(n, np.float64), "prompt_tokens": np.empty(n, np.int64),
            "output_tokens": np.empty(n, np.int64)}
    done = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # rows longer than the header
            for chunk in pd.read_csv(fh, dtype=dict.fromkeys(COLUMNS, np.float64), chunksize=CHUNK_ROWS * 4,
                                     encoding="utf-8", index_col=False, skip_blank_lines=False,
                                     keep_default_na=False):
                if not set(COLUMNS) <= set(chunk.columns) or done + len(chunk) > n or _any_bad(chunk):
                    return None
                for col, out in cols.items():
                    out[done : done + len(chunk)] = chunk[col].to_numpy()
                done += len(chunk)
    except (ValueError, TypeError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.ParserWarning, OSError):
        return None
    if done != n:
        return None
    cols["line"] = np.arange(2, n + 2, dtype=np.int64)
    return pd.DataFrame(cols, copy=False)


def _any_bad(chunk: pd.DataFrame) -> bool:
    ts = chunk["timestamp"].to_numpy()
    if np.any(~np.isfinite(ts) | (ts < 0)):
        return True
    tokens = chunk[["prompt_tokens", "output_tokens"]].to_numpy()
    with np.errstate(invalid="ignore"):
        return bool(np.any(~np.isfinite(tokens) | (tokens < 1) | (tokens > MAX_TOKENS) | (tokens != np.floor(tokens))))


def _count_lines(fh: BinaryIO) -> int:
    lines, last = 0, b"\n"
    while block := fh.read(1 << 22):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


def _read_rows(path: Path, rows: Iterator[list[str]], columns: tuple[int, list[int]]) -> pd.DataFrame:
    width, (it, ip, io) = columns
    text: list[list[str]] = [[], [], []]
    lines: list[int] = []
    parts: list[pd.DataFrame] = []
    line = 1
    try:
        for row in rows:
            line = rows.line_num
            if len(row) != width:
                if not row:
                    continue  # a blank line
                raise ScenarioError(f"{path}: line {line}: {len(row)} fields, the header line has {width}")
            text[0].append(row[it])
            text[1].append(row[ip])
            text[2].append(row[io])
            lines.append(line)
            if len(lines) == CHUNK_ROWS:
                parts.append(_convert_chunk(path, text, lines))
                text, lines = [[], [], []], []
    except csv.Error as exc:
        raise ScenarioError(f"{path}: line {line + 1}: not CSV ({exc})") from None
    parts.append(_convert_chunk(path, text, lines))
    return pd.concat(parts, ignore_index=True)


def _convert_chunk(path: Path, text: list[list[str]], lines: list[int]) -> pd.DataFrame:
    out = {}
    for col, values in zip(COLUMNS, text, strict=True):
        numbers = pd.to_numeric(pd.Series(values, dtype=object).str.strip(), errors="coerce").to_numpy(np.float64)
        if col == "timestamp":
            bad, need = ~np.isfinite(numbers) | (numbers < 0), "a finite number >= 0 (seconds)"
        else:
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(numbers) | (numbers < 1) | (numbers > MAX_TOKENS) | (numbers != np.floor(numbers))
            need = f"an integer in [1, {MAX_TOKENS}] (tokens)"
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ScenarioError(f"{path}: line {lines[i]}, column {col!r}: {values[i]!r} is not {need}")
        out[col] = numbers if col == "timestamp" else numbers.astype(np.int64)
    out["line"] = np.asarray(lines, dtype=np.int64)
    return pd.DataFrame(out)


def read_hash_ids(path: Path, fh: BinaryIO, requests: pd.DataFrame, hash_tokens: int) -> list[np.ndarray]:
    """The ``hash_ids`` column of the request CSV ``path``, read from ``fh`` at its start (rows in file order,
    as ``requests``): one id per ``hash_tokens`` prompt tokens, integers in ``[0, 2**63)``; errors name the line
    and the fix."""
    fix = (f"prefix caching needs a {HASH_COLUMN!r} column: per request, space-separated integer ids of its prompt's "
           f"{hash_tokens}-token chunks (as in Mooncake's traces); add it, or replay without prefix caching "
           "(--prefix-caching false)")
    try:
        column = pd.read_csv(fh, usecols=[HASH_COLUMN], dtype=str, keep_default_na=False, encoding="utf-8")
    except ValueError:  # pandas: usecols names a column the header lacks
        raise ScenarioError(f"{path}: no {HASH_COLUMN!r} column; {fix}") from None
    texts = column[HASH_COLUMN].tolist()
    if len(texts) != len(requests):
        raise ScenarioError(f"{path}: {len(texts)} {HASH_COLUMN!r} values for {len(requests)} requests; {fix}")
    prompts, lines = requests["prompt_tokens"].tolist(), requests["line"].tolist()
    return [_hash_ids(path, text, prompt, hash_tokens, line)
            for text, prompt, line in zip(texts, prompts, lines, strict=True)]


def _hash_ids(path: Path, text: str, prompt: int, hash_tokens: int, line: int) -> np.ndarray:
    where = f"{path}: line {line}, column {HASH_COLUMN!r}"
    try:
        ids = np.array([int(x) for x in text.split()], dtype=np.int64)
    except (ValueError, OverflowError):
        raise ScenarioError(f"{where}: {text[:40]!r} is not space-separated integer ids") from None
    if len(ids) and ids.min() < 0:
        raise ScenarioError(f"{where}: a negative id ({int(ids.min())}); ids are integers >= 0")
    if len(ids) != -(-prompt // hash_tokens):
        raise ScenarioError(f"{where}: {len(ids)} ids for {prompt} prompt tokens; one id per {hash_tokens} tokens "
                            f"needs {-(-prompt // hash_tokens)} (set --hash-tokens to the file's chunk size)")
    return ids


def hash_id_chain(ids: np.ndarray, prompt: int, block_size: int, hash_tokens: int, unique: int) -> TokenChain:
    """The block hash chain of a request with these hash ids (see the module docstring): the blocks of its whole
    ``hash_tokens`` chunks from the ids, the rest (a partial last chunk, then its output) of content ``unique``."""
    per = hash_tokens // block_size
    prefix, parent = [], ROOT
    for j in range(prompt // hash_tokens * per):
        parent = block_hash(parent, int(ids[j // per]), j % per)
        prefix.append(parent)
    return TokenChain(UNIQUE | unique, prefix)


class OpenLoop:
    """Requests in arrival order (columns of arrays), made and released when their arrival step comes."""

    def __init__(self, prompt: np.ndarray, output: np.ndarray, arrival: np.ndarray,
                 chain: Callable[[int], TokenChain] | None = None) -> None:
        self.prompt, self.output, self.arrival, self.chain = prompt, output, arrival, chain
        self.next = 0

    @property
    def pending(self) -> bool:
        return self.next < len(self.arrival)

    def __call__(self, step: int, want: int) -> Iterator[Request]:
        while self.next < len(self.arrival) and self.arrival[self.next] <= step:
            i = self.next
            self.next += 1
            chain = self.chain(i) if self.chain is not None else None
            yield Request(i, int(self.prompt[i]), int(self.output[i]), int(self.arrival[i]), chain=chain)


def _window(name: str, p: dict) -> pd.DataFrame:
    hash_tokens = p["hash_tokens"] if p.get("prefix_caching") else None
    if hash_tokens is not None and hash_tokens % p["block_size"]:
        raise ScenarioError(f"--hash-tokens {hash_tokens}: must be a multiple of block_size={p['block_size']} (a "
                            "block lies in one hash-id chunk); lower --block-size")
    df = read_requests_csv(p["csv"], hash_tokens)
    start = p["start_s"]
    end = math.inf if p["duration_s"] is None else start + p["duration_s"]
    inside = (df.timestamp >= start) & (df.timestamp < end)
    window = df if inside.all() else df[inside]
    if window.empty:
        raise ScenarioError(f"{name}: no request arrives in the window [{start}, {end}) s; "
                            f"the file's requests arrive in [{df.timestamp.iloc[0]}, {df.timestamp.iloc[-1]}] s")
    return window if window is df else window.reset_index(drop=True)


def _max_blocks(name: str, p: dict, window: pd.DataFrame) -> int:
    """Blocks per sequence; a request a sequence (or the pool) cannot hold fails naming its line and column."""
    bs = p["block_size"]
    cap_blocks = p["max_blocks_per_seq"] or p["num_blocks"]
    cap = cap_blocks * bs
    what = ("max_blocks_per_seq * block_size" if p["max_blocks_per_seq"] else "the pool (num_blocks * block_size)")
    fix = "raise --max-blocks-per-seq" if p["max_blocks_per_seq"] else "raise --num-blocks"
    total = window.prompt_tokens + window.output_tokens
    for col, tokens in (("prompt_tokens", window.prompt_tokens), ("output_tokens", total)):
        over = np.flatnonzero((tokens > cap).to_numpy())
        if len(over):
            k = int(over[0])
            prompt, output = int(window.prompt_tokens.iat[k]), int(window.output_tokens.iat[k])
            amount = f"{prompt} prompt" + ("" if col == "prompt_tokens" else f" + {output} output = {prompt + output}")
            raise ScenarioError(f"{p['csv']}: line {int(window.line.iat[k])}, column {col!r}: {amount} tokens exceed "
                                f"what a sequence can hold, {what} = {cap}; {fix} or drop that request")
    return p["max_blocks_per_seq"] or blocks_for(int(total.max()), bs)


def _check_steps(name: str, p: dict, window: pd.DataFrame, arrival: np.ndarray) -> None:
    """Fail before simulating when the window cannot finish within max_steps (a lower bound, Little's law)."""
    outputs = window.output_tokens.to_numpy()
    need = max(-(-int(outputs.sum()) // p["concurrency"]), int((arrival + outputs).max()))
    if need <= p["max_steps"]:
        return
    span = float(window.timestamp.iloc[-1] - window.timestamp.iloc[0])
    fits = span * p["max_steps"] / need * 0.8
    hint = f"--duration-s {float(f'{fits:.2g}'):.12g}" if fits > 0 else "--duration-s (fewer requests)"
    raise ScenarioError(
        f"{p['csv']}: the {len(window)} requests in the window need at least {need} decode steps ({int(outputs.sum())} "
        f"output tokens at {p['concurrency']} sequences per step), more than max_steps={p['max_steps']}; "
        f"shorten the window with {hint} (and --start-s), or raise --max-steps"
    )


def build_real_trace(name: str, p: dict) -> Trace:
    """Replay a request CSV (``p['csv']``) through the scheduler; see the module docstring."""
    window = _window(name, p)
    max_blocks = _max_blocks(name, p, window)
    # Little's law: `concurrency` busy sequences finish concurrency / mean_output requests per step.
    arrivals_per_step = p["concurrency"] / float(window.output_tokens.mean())
    span = max(float(window.timestamp.iloc[-1] - window.timestamp.iloc[0]), 1e-9)
    steps_per_trace_second = len(window) / span / arrivals_per_step
    arrival = np.floor((window.timestamp.to_numpy() - window.timestamp.iloc[0]) * steps_per_trace_second)
    arrival = np.minimum(arrival, p["max_steps"] + 1).astype(np.int64)
    _check_steps(name, p, window, arrival)

    prompts = window.prompt_tokens.to_numpy()
    chain = None
    if p.get("prefix_caching"):
        ids = window[HASH_COLUMN].tolist()

        def chain(i: int) -> TokenChain:
            return hash_id_chain(ids[i], int(prompts[i]), p["block_size"], p["hash_tokens"], i)

    source = OpenLoop(prompts, window.output_tokens.to_numpy(), arrival, chain)
    config = {"num_blocks": p["num_blocks"], "block_size": p["block_size"], "max_seqs": p["concurrency"],
              "max_blocks_per_seq": max_blocks}
    sched = Scheduler(TraceBuilder(config), source, p["concurrency"], preempt=True)
    while source.pending or not sched.idle:
        if sched.step >= p["max_steps"]:
            raise ScenarioError(f"{name}: still running after max_steps={p['max_steps']} steps (the pool holds fewer "
                                "sequences than --concurrency); shorten the window with --duration-s or raise "
                                "--max-steps")
        sched.run_step()
    params = {**p, "max_blocks_per_seq": max_blocks, "requests_in_window": len(window),
              "arrivals_per_step": round(arrivals_per_step, 4),
              "time_compression": round(p["step_rate"] / steps_per_trace_second, 1)}
    return sched.finish(name, params, p["seed"])
