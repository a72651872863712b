"""Callgrind instruction counts and simulated cache misses of replay regions. Design: docs/measurement.md#callgrind."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness.base import lifetime

_HERE = Path(__file__).resolve().parent
_HARNESS = _HERE.parent
_REPO = _HARNESS.parent
_C_SOURCE = _HERE / "valgrind_region.c"

# (bytes, ways, line) of a server core's L1s and L2 (as LL), fixed: miss counts must not depend on the machine.
CACHE_SIM = {"I1": (32768, 8, 64), "D1": (49152, 12, 64), "LL": (2097152, 16, 64)}
CACHE_GEOMETRY = "callgrind cache simulation: D1 48 KiB 12-way, I1 32 KiB 8-way, LL 2 MiB 16-way, 64-byte lines"

EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
CACHE_WARM_STEPS = 2  # zeroed after: the simulated caches then hold the working set
# What callgrind's processes set apart from the run's environment, which they otherwise see whole (a design whose
# work depends on a variable is counted as it is timed): each needed for counts that repeat exactly.
PINNED_ENV = {"PYTHONHASHSEED": "0", "LC_ALL": "C", "NUMBA_CPU_NAME": "generic", "OMP_NUM_THREADS": "1"}
# Heap layouts (regions' --layout) whose fewest count is a gated cell's figure: docs/measurement.md#heap-layouts
LAYOUTS = (0, 1, 2)


class CallgrindError(RuntimeError):
    """Valgrind or the region script failed, or the dump files lack a region; the message says which."""


class CallgrindUnavailable(CallgrindError):
    """Valgrind, gcc or valgrind's headers are missing: no figure can be measured here."""


@dataclass(frozen=True)
class Counts:
    """Callgrind events of one cell: its region minus its empty region, and the work the region did."""

    ir: int
    seq_steps: int
    steps: int
    dr: int | None = None
    dw: int | None = None
    i1mr: int | None = None
    d1mr: int | None = None
    d1mw: int | None = None
    ilmr: int | None = None
    dlmr: int | None = None
    dlmw: int | None = None

    @property
    def instructions_per_seq_step(self) -> float:
        """Instructions per sequence-step (one sequence advanced by one decode step, pool ops included)."""
        return self.ir / self.seq_steps

    @property
    def instructions_per_step(self) -> float:
        """Instructions per decode step of the whole batch."""
        return self.ir / self.steps

    @property
    def l1d_miss_pct(self) -> float | None:
        """Simulated L1D misses (reads and writes) per 100 data accesses; None without cache simulation."""
        if self.dr is None or self.dw is None or self.d1mr is None or self.d1mw is None:
            return None
        return (self.d1mr + self.d1mw) / (self.dr + self.dw) * 100.0

    @classmethod
    def from_events(cls, region: dict[str, int], empty: dict[str, int], seq_steps: int, steps: int) -> Counts:
        """The difference of two dumps' totals (events missing from a dump stay None)."""
        diff = {name.lower(): region[name] - empty.get(name, 0) for name in EVENTS if name in region}
        return cls(seq_steps=seq_steps, steps=steps, **diff)


def build_dir() -> Path:
    """Where the compiled client-request library and the dedicated Numba cache live."""
    if os.environ.get("KVBLOCK_BENCH_BUILD"):
        root = Path(os.environ["KVBLOCK_BENCH_BUILD"])
    elif (_REPO / "pyproject.toml").is_file():
        root = _REPO / "build"
    else:
        root = Path.home() / ".cache" / "kvblock-bench"
    return root / "callgrind"


def _digest(paths: list[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for item in extra:
        h.update(item.encode())
    return h.hexdigest()[:16]


@cache
def region_library() -> Path:
    """The client-request library, compiled once per source (and compiler) into :func:`build_dir`."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise CallgrindUnavailable(f"no C compiler ({cc}) to build {_C_SOURCE.name}; install gcc")
    lib = build_dir() / f"valgrind_region-{_digest([_C_SOURCE], cc)}.so"
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=lib.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(_C_SOURCE)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            hint = " (valgrind's headers are missing: install valgrind)" if "valgrind/" in proc.stderr else ""
            raise CallgrindUnavailable(f"could not compile {_C_SOURCE.name}{hint}: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def numba_cache_dir() -> Path:
    """A Numba cache used only by callgrind runs, keyed by the sources of what it caches and the toolchain."""
    import numba

    sources = [*(_REPO / "impls").rglob("*.py"), _HERE / "regions.py", _HARNESS / "base" / "clock.py",
               _HARNESS / "base" / "drivers.py"]
    key = _digest(sources, numba.__version__, sys.version, platform.machine())
    return build_dir() / f"numba-{key}"


@cache
def _aslr_prefix() -> tuple[str, ...]:
    """``setarch <machine> -R`` when it works here (some containers forbid changing the personality)."""
    if shutil.which("setarch") is None:
        warnings.warn("setarch not found: address-space randomisation stays on; counts may vary slightly",
                      stacklevel=3)
        return ()
    prefix = ("setarch", platform.machine(), "-R")
    if subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode != 0:
        warnings.warn("setarch -R failed here: address-space randomisation stays on; counts may vary slightly",
                      stacklevel=3)
        return ()
    return prefix


def available() -> tuple[bool, str]:
    """Whether callgrind measurements can run here, and if not, why (never a guessed figure)."""
    if sys.platform != "linux":
        return False, f"callgrind measurements need Linux (this is {sys.platform})"
    if shutil.which("valgrind") is None:
        return False, "valgrind is not installed (apt-get install valgrind)"
    try:
        lib = region_library()
    except CallgrindUnavailable as exc:
        return False, str(exc)
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return True, f"{version}, client requests from {lib.name}"


def environment(numba_cache: Path, code: str = "") -> dict[str, str]:
    """The environment of both the native warm-up and the valgrind run: the run's, with :data:`PINNED_ENV`, the
    callgrind runs' own Numba cache, this checkout first on ``PYTHONPATH`` and the C++ libraries already built
    (the designs' only for this checkout's code: another ``code`` root builds its own)."""
    pythonpath = [str(_REPO)] if (_REPO / "pyproject.toml").is_file() else []
    env = {**os.environ, **PINNED_ENV, "NUMBA_CACHE_DIR": str(numba_cache),
           "PYTHONPATH": os.pathsep.join(_python_path(pythonpath))}
    native = sys.modules.get("impls.native")
    if native is not None and native.BUILD is not None:
        from harness.base import native as native_driver

        if not code:
            env[native.toolchain.LIBRARY_ENV] = str(native.BUILD.path)
        env[native_driver.LIBRARY_ENV] = str(native_driver.build().path)
    return env


def _python_path(first: list[str]) -> list[str]:
    """``first``, then the run's ``PYTHONPATH`` entries not among them."""
    return list(dict.fromkeys([*first, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))


def environment_differences(env: dict[str, str]) -> list[str]:
    """What ``env`` sets otherwise than this process's environment, in words (``NAME=value (the run: ...)``)."""
    return [f"{name}={value} (the run: {os.environ.get(name, 'unset')})"
            for name, value in env.items() if os.environ.get(name) != value]


def valgrind_command(out_file: Path, cache_sim: bool) -> list[str]:
    """The valgrind part of the command line (the region script's command follows it)."""
    cmd = [*_aslr_prefix(), "valgrind", "-q", "--tool=callgrind", "--instr-atstart=no", "--dump-line=no",
           f"--cache-sim={'yes' if cache_sim else 'no'}", f"--callgrind-out-file={out_file}"]
    if cache_sim:
        cmd += [f"--{name}={size},{assoc},{line}" for name, (size, assoc, line) in CACHE_SIM.items()]
    return cmd


def region_args(trace_path: Path, cells: list[tuple[str, str]], warm_steps: int, steps: int, cache_warm: int,
                lib: Path, code: str = "", layout: int = 0) -> list[str]:
    """Command line of :mod:`harness.counters.regions` for these cells (``code``: another root's designs)."""
    from harness.base import coderoot

    start = ([str(Path(coderoot.__file__)), code, str(coderoot.repository())] if code else ["-m"])
    args = [sys.executable, *start, "harness.counters.regions", "--trace", str(trace_path), "--lib", str(lib),
            "--warm", str(warm_steps), "--steps", str(steps), "--cache-warm", str(cache_warm)]
    for impl, regime in cells:
        args += ["--cell", impl, regime]
    return [*args, "--layout", str(layout)] if layout else args


_TRIGGER = re.compile(r"^desc: Trigger: Client Request: (.*)$", re.MULTILINE)
_EVENTS = re.compile(r"^events: (.*)$", re.MULTILINE)
_TOTALS = re.compile(r"^totals: (.*)$", re.MULTILINE)


def dump_files(out_file: Path) -> dict[str, Path]:
    """Every client-request dump (``<out_file>.<n>``) by its label."""
    files = {}
    for path in sorted(out_file.parent.glob(out_file.name + ".*")):
        trigger = _TRIGGER.search(path.read_text(errors="replace"))
        if trigger:
            files[trigger.group(1)] = path
    return files


def parse_dumps(out_file: Path) -> dict[str, dict[str, int]]:
    """Totals of every client-request dump (``<out_file>.<n>``), by label."""
    dumps: dict[str, dict[str, int]] = {}
    for path in dump_files(out_file).values():
        text = path.read_text(errors="replace")
        trigger, events, totals = _TRIGGER.search(text), _EVENTS.search(text), _TOTALS.search(text)
        if not (trigger and events and totals):
            continue
        names, values = events.group(1).split(), [int(v) for v in totals.group(1).split()]
        values += [0] * (len(names) - len(values))
        dumps[trigger.group(1)] = dict(zip(names, values, strict=True))
    return dumps


_RUNNING: set[subprocess.Popen] = set()


def _run(cmd: list[str], env: dict[str, str], timeout: float, what: str) -> None:
    with subprocess.Popen(cmd, env=env, cwd=_REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lifetime.tied_to_me()) as proc:
        _RUNNING.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise CallgrindError(f"{what} ran past {timeout:.0f} s: {' '.join(cmd)}") from None
        finally:
            _RUNNING.discard(proc)
    if proc.returncode != 0:
        tail = (err or out).strip()[-2000:]
        raise CallgrindError(f"{what} failed with exit status {proc.returncode}:\n{tail}")


def _all_parts(pool: concurrent.futures.ThreadPoolExecutor, one_process: Callable, jobs: list) -> list:
    """``one_process`` of every job in ``pool``; interrupted, the jobs left are dropped and valgrind killed."""
    futures = [pool.submit(one_process, job) for job in jobs]
    try:
        return [future.result() for future in futures]
    except BaseException:
        for future in futures:
            future.cancel()
        for proc in list(_RUNNING):
            proc.kill()
        raise


def _check_request(trace_path: Path, cells: list[tuple[str, str]], warm_steps: int, steps: int,
                   import_plugins: bool = True) -> list[int]:
    """Sequences decoding in each measured step; InputError (PluginError) for a bad cell or range, before any run."""
    from harness.base.replay import REGIMES
    from harness.errors import InputError
    from impls import REGISTRY, UNAVAILABLE
    from impls.registry import load_plugin
    from scenarios import load

    for impl, regime in cells:
        if impl in UNAVAILABLE:
            raise InputError(f"implementation {impl!r} cannot run here: {UNAVAILABLE[impl]}")
        if impl not in REGISTRY and import_plugins:
            load_plugin(impl)
        if regime not in REGIMES:
            raise InputError(f"unknown regime {regime!r}; choose from {REGIMES}")
    trace = load(trace_path)
    if warm_steps < 1 or steps < 1:
        raise InputError(f"need warm_steps >= 1 and steps >= 1, got {warm_steps} and {steps}")
    if warm_steps + steps > trace.num_steps:
        raise InputError(f"{trace_path} has {trace.num_steps} steps; warm {warm_steps} + {steps} do not fit")
    return trace.running_per_step()[warm_steps : warm_steps + steps].tolist()


def measure_runs(trace_path: str | os.PathLike, cells: list[tuple[str, str]], warm_steps: int, steps: int,
                 cache_sim: bool = True, layouts: tuple[int, ...] = (0,), timeout: float = 1800.0, split: int = 1,
                 import_plugins: bool = True, code: str = "") -> list[dict[tuple[str, str], Counts]]:
    """Measure ``cells`` in parallel valgrind processes, one run per entry of ``layouts`` (heap layouts); one result
    per run (``code``: another checkout's designs, :mod:`harness.base.coderoot`)."""
    ok, why = available()
    if not ok:
        raise CallgrindUnavailable(why)
    trace_path = Path(trace_path).resolve()
    running = _check_request(trace_path, cells, warm_steps, steps, import_plugins and not code)
    cache_warm = min(CACHE_WARM_STEPS, warm_steps - 1) if cache_sim else 0
    numba_cache = numba_cache_dir()
    numba_cache.mkdir(parents=True, exist_ok=True)
    env = environment(numba_cache, code)
    lib = region_library()
    _run(region_args(trace_path, cells, warm_steps, steps, cache_warm, lib, code), env, timeout,
         "native warm-up of the region script")
    groups = [g for g in (cells[i :: max(1, split)] for i in range(max(1, split))) if g]

    def one_process(job: tuple[int, Path, list[tuple[str, str]]]) -> dict[tuple[str, str], Counts]:
        run, out_dir, group = job
        out_file = out_dir / "callgrind.out"
        args = region_args(trace_path, group, warm_steps, steps, cache_warm, lib, code, layouts[run])
        _run([*valgrind_command(out_file, cache_sim), *args], env, timeout, "callgrind run")
        dumps = parse_dumps(out_file)
        result = {}
        for impl, regime in group:
            region, empty = dumps.get(f"{impl}|{regime}|{steps}"), dumps.get(f"{impl}|{regime}|0")
            if region is None or empty is None:
                raise CallgrindError(f"{out_dir}: no dump for {impl}|{regime} (dumps: {sorted(dumps)})")
            result[(impl, regime)] = Counts.from_events(region, empty, int(sum(running)), steps)
        return result

    with tempfile.TemporaryDirectory(prefix="kvb-callgrind-") as tmp:
        jobs = [(r, Path(tmp) / f"run{r}-part{g}", group) for r in range(len(layouts))
                for g, group in enumerate(groups)]
        for _, d, _ in jobs:
            d.mkdir()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            parts = _all_parts(pool, one_process, jobs)
    results: list[dict[tuple[str, str], Counts]] = [{} for _ in layouts]
    for (run, _, _), part in zip(jobs, parts, strict=True):
        results[run].update(part)
    return [{cell: r[cell] for cell in cells} for r in results]


def dump_regions(trace_path: str | os.PathLike, cells: list[tuple[str, str]], warm_steps: int, steps: int,
                 out_dir: Path, timeout: float = 1800.0) -> int:
    """One valgrind run of ``cells`` (no cache simulation) whose dumps stay in ``out_dir``: ``callgrind.out.<n>``,
    one per region (:func:`parse_dumps`' labels), and where the compiled functions sit (``layouts.json``,
    ``starts.json``: :mod:`harness.counters.symbols`).
    Returns the sequence-steps each cell's region covers."""
    ok, why = available()
    if not ok:
        raise CallgrindUnavailable(why)
    trace_path = Path(trace_path).resolve()
    running = _check_request(trace_path, cells, warm_steps, steps)
    numba_cache = numba_cache_dir()
    numba_cache.mkdir(parents=True, exist_ok=True)
    env = environment(numba_cache)
    args = region_args(trace_path, cells, warm_steps, steps, 0, region_library())
    _run(args, env, timeout, "native warm-up of the region script")
    _run([*valgrind_command(out_dir / "callgrind.out", False), *args, "--symbols", str(out_dir / "starts.json")],
         env, timeout, "callgrind run")
    with tempfile.TemporaryDirectory(prefix="kvb-numba-") as fresh:  # compiled as the measured cache was filled
        layout = [sys.executable, "-m", "harness.counters.symbols", "--trace", str(trace_path),
                  "--out", str(out_dir / "layouts.json"), *(x for cell in cells for x in ("--cell", *cell))]
        _run(layout, {**env, "NUMBA_CACHE_DIR": fresh}, timeout, "the compiled functions' layout")
    return int(sum(running))


def measure(trace_path: str | os.PathLike, cells: list[tuple[str, str]], warm_steps: int, steps: int,
            cache_sim: bool = True, timeout: float = 1800.0, split: int = 1) -> dict[tuple[str, str], Counts]:
    """Callgrind counts per cell (region minus empty region) from one run over ``split`` processes."""
    return measure_runs(trace_path, cells, warm_steps, steps, cache_sim=cache_sim, timeout=timeout,
                        split=split)[0]
