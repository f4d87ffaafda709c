"""The threads of the parallel kernels: OpenMP's brief spin before a thread sleeps (set at import,
before numba starts its pool), the thread count (``set_threads``) and one thread for small work
(``threads_for``)."""

from __future__ import annotations

import os

# numba's OpenMP threading layer (libgomp; its default here: TBB is rarely installed) lets idle
# threads spin for a while (GOMP_SPINCOUNT, 300,000 by default) before they sleep. When another
# process uses a core, a parallel region then waits for a descheduled thread while its peers burn
# the other core (measured on the tiny fixture with one core busy: 11-20 tok/s with the default
# spin, 625-1270 tok/s passive). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs a futex wake-up
# per parallel region instead: 45-50 µs on the 2-core AMD EPYC VM (115-130 µs on the Xeon one;
# a halted vCPU is woken through the hypervisor), ~30 regions per decode step. A short spin
# sits between the two: 3,000 spins keep the threads awake through gaps of up to ~50-100 µs
# (the Python between a step's matmuls) and let them sleep soon after. EPYC, Llama-3.1-8B-dims
# Q4_0, ours ÷ llama.cpp (its own process and defaults), 3 alternated processes of 4 rounds:
# passive 0.895/0.945/0.903, 3,000 spins 0.956/0.933/1.013 (10,000: 0.964/0.973). With one core
# busy (benchmarks/busy_core.py, Q4_K_M): passive kept 0.71 of the idle speed, 3,000 spins 0.64,
# 10,000 spins 0.41, llama.cpp 0.49. Set before numba starts its pool, unless the user chose a
# policy or a count. libgomp is one per process: a llama.cpp loaded into the same process (its
# CPU backend uses OpenMP) gets this setting too; OMP_SET_HERE lets a caller give a child
# process its own defaults (benchmarks/llamacpp_worker.py).
SPIN_COUNT = "3000"
OMP_SET_HERE: tuple[str, ...] = ()
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    OMP_SET_HERE = ("GOMP_SPINCOUNT",)


def physical_cores() -> int:
    """Physical cores of this machine (hyper-threads not counted): the default thread count."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except ImportError:  # pragma: no cover - psutil is a dependency of the toolchain
        n = None
    return max(1, n or os.cpu_count() or 1)


_THREADS = {"want": 0, "now": 0}  # set_threads' count (0: never called) and the count in effect
# below this many bytes touched, a parallel region costs more than it saves: a second thread's
# wake-up (~120 µs here) is the time one thread takes to read ~1.5 MB (13 GB/s per core)
SERIAL_BYTES = 1 << 20


def set_threads(n: int | None = None) -> int:
    """Run the parallel kernels on ``n`` threads (default: physical cores, at most what numba
    started with); returns the count in effect. ``n`` above numba's pool is an error."""
    import numba

    from aios.errors import UsageError

    pool = numba.config.NUMBA_NUM_THREADS
    if n is None:
        n = min(physical_cores(), pool)
    if not 1 <= n <= pool:
        raise UsageError(f"--threads {n} is outside 1..{pool} (numba's thread pool here; "
                         "NUMBA_NUM_THREADS sets its size).")
    numba.set_num_threads(n)
    _THREADS["want"] = _THREADS["now"] = n
    _blas_threads(n)
    return n


def _blas_threads(n: int) -> None:
    """The BLAS behind numpy (the many-token GEMMs, runtime.kernels.gemm) on ``n`` threads too,
    through threadpoolctl (a dependency of scikit-learn, ours); the limit holds until the next call."""
    from threadpoolctl import ThreadpoolController

    if _THREADS.get("blas") is None:
        _THREADS["blas"] = ThreadpoolController()
    _THREADS["blas"].limit(limits=n, user_api="blas")


def threads_for(nbytes: int) -> None:
    """Before a parallel kernel that touches ``nbytes``: one thread below SERIAL_BYTES, else the
    ``set_threads`` count (a tiny model's every matmul, a short attention, run without waking the
    pool). Changes numba's setting only when the choice changes (a set costs ~2.5 µs). Without a
    ``set_threads`` call (library use: the checker, perplexity), the count is numba's setting at
    the first call."""
    want = _THREADS["want"]
    if want == 0:
        import numba

        want = _THREADS["want"] = _THREADS["now"] = numba.get_num_threads()
    if want > 1:
        n = 1 if nbytes < SERIAL_BYTES else want
        if n != _THREADS["now"]:
            import numba

            numba.set_num_threads(n)
            _THREADS["now"] = n


def one_blas_thread():
    """A context in which BLAS runs on one thread. The predictor's two products are ~10⁵–10⁶
    multiply-adds per token and layer; with OpenBLAS's default of one thread per core its second
    thread waits for a core that numba's pool still holds (spinning after the last parallel
    kernel): 3-12 ms per call measured on 2 cores, against ~0.1 ms on one thread."""
    from threadpoolctl import ThreadpoolController

    if _THREADS.get("blas") is None:
        _THREADS["blas"] = ThreadpoolController()
    return _THREADS["blas"].limit(limits=1, user_api="blas")
