// The native replay driver: harness/base/drivers.py's compiled replay loop, in C++, for the C++ designs.
//
// One foreign call replays steps [lo, hi) of a trace on a manager of impls/native/designs.cpp, calling the
// design through the addresses of its per-call C functions (DesignOps, filled in by harness/base/native.py
// from the designs' library), and times it as the compiled driver does: detail = 0, each whole step as one
// region (column K_DECODE); detail = 1, each pool operation by kind, the decode step, and a lookup apart
// (column K_LOOKUP, not part of the step). The contract's codes (kvb::OK, kvb::E_TRACE, op codes) and the
// timing columns (kvb::K_*) come in the generated prelude the build puts before this file.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define KVB_HAVE_TSC 1
#else
#define KVB_HAVE_TSC 0
#endif

#define KVB_API extern "C" __attribute__((visibility("default")))

namespace {

using namespace kvb;

// ---- clocks ---------------------------------------------------------------------------------------------
struct Tsc {
    static int64_t now() {
#if KVB_HAVE_TSC
        asm volatile("" ::: "memory");
        int64_t t = static_cast<int64_t>(__rdtsc());
        asm volatile("" ::: "memory");
        return t;
#else
        return 0;
#endif
    }
};
struct Steady {
    static int64_t now() {
        asm volatile("" ::: "memory");
        int64_t t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count();
        asm volatile("" ::: "memory");
        return t;
    }
};

int64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- the design, through its per-call C functions ---------------------------------------------------------
struct DesignOps {  // the order of harness/base/native.py's DesignOps fields
    int64_t (*can_allocate)(void*, int64_t);
    int64_t (*allocate)(void*, int64_t, int64_t);
    int64_t (*fork)(void*, int64_t, int64_t);
    int64_t (*free)(void*, int64_t);
    int64_t (*decode_step)(void*, const int32_t*, int64_t, int64_t*, int64_t, int64_t*, int64_t, int64_t*);
    int64_t (*lookup)(void*, const int32_t*, int64_t, int64_t*, int64_t, int64_t*);
    int64_t (*alloc_count)();
};

struct TraceView {
    const uint8_t* op;
    const int32_t* a0;
    const int32_t* a1;
    int64_t num_ops;
    const int64_t* step_offsets;  // num_steps + 1
    const int64_t* decode_offsets;  // num_steps
    int64_t num_steps;
};

struct ReplayOut {
    int64_t* cow;  // [cap, 2] scratch
    int64_t* slots;  // [cap] scratch
    int64_t cap;
    int64_t* ticks;  // [hi - lo, NKINDS], zeroed by the caller
    int64_t* cows;  // [hi - lo]
    int64_t* allocs;  // [hi - lo]
    int64_t out_steps;  // rows the three arrays above hold
    int64_t status[3];  // status, step, op index
};

int64_t check_slice(const TraceView& t, int64_t lo, int64_t hi, const ReplayOut& o) {
    if (lo < 0 || hi < lo || hi > t.num_steps || hi - lo > o.out_steps) return E_TRACE;
    for (int64_t s = lo; s < hi; ++s) {
        int64_t a = t.step_offsets[s], m = t.decode_offsets[s], b = t.step_offsets[s + 1];
        if (a < 0 || m < a || b < m || b > t.num_ops || b - m > o.cap) return E_TRACE;
    }
    return OK;
}

inline __attribute__((always_inline)) int64_t pool_op(const DesignOps& d, void* h, const TraceView& t, int64_t i,
                                                       int* kind) {
    switch (t.op[i]) {
        case CAN_ALLOCATE: {
            *kind = K_OTHER;
            int64_t rc = d.can_allocate(h, t.a0[i]);
            return rc == t.a1[i] ? OK : (rc < 0 ? rc : 1);  // 1: an answer the trace does not expect
        }
        case ALLOCATE:
            *kind = K_ALLOC;
            return d.allocate(h, t.a0[i], t.a1[i]);
        case FREE:
            *kind = K_FREE;
            return d.free(h, t.a0[i]);
        case FORK:
            *kind = K_OTHER;
            return d.fork(h, t.a0[i], t.a1[i]);
        default:
            *kind = K_OTHER;
            return E_TRACE;
    }
}

template <class Clock>
int64_t replay(const DesignOps& d, void* h, const TraceView& t, int64_t lo, int64_t hi, bool detail, ReplayOut& o) {
    int64_t rc = check_slice(t, lo, hi, o);
    if (rc != OK) return rc;
    int64_t detail_code = 0;
    for (int64_t s = lo; s < hi; ++s) {
        int64_t* row = o.ticks + (s - lo) * NKINDS;
        int64_t allocs0 = d.alloc_count();
        int64_t t_step = Clock::now();
        for (int64_t i = t.step_offsets[s]; i < t.decode_offsets[s]; ++i) {
            int kind = K_OTHER;
            int64_t t0 = detail ? Clock::now() : 0;
            rc = pool_op(d, h, t, i, &kind);
            if (detail) row[kind] += Clock::now() - t0;
            if (rc != OK) {
                o.status[1] = s, o.status[2] = i;
                return rc;
            }
        }
        const int32_t* ids = t.a0 + t.decode_offsets[s];
        int64_t n = t.step_offsets[s + 1] - t.decode_offsets[s];
        int64_t t0 = detail ? Clock::now() : 0;
        rc = d.decode_step(h, ids, n, o.cow, o.cap, o.slots, o.cap, &detail_code);
        int64_t t1 = Clock::now();
        o.allocs[s - lo] = d.alloc_count() - allocs0;
        if (rc < 0) {
            o.status[1] = s, o.status[2] = t.decode_offsets[s];
            return rc;
        }
        o.cows[s - lo] = rc;
        if (detail) {
            row[K_DECODE] = t1 - t0;
            t0 = Clock::now();
            d.lookup(h, ids, n, o.slots, o.cap, &detail_code);
            row[K_LOOKUP] = Clock::now() - t0;
        } else {
            row[K_DECODE] = t1 - t_step;  // the whole step as one region
        }
    }
    return OK;
}

}  // namespace

// 1 when this build can read the TSC (x86), else 0 (replays then use steady_clock, in ns).
KVB_API int64_t kvb_have_tsc() { return KVB_HAVE_TSC; }

// TSC period in ns: median of five 20 ms calibrations against CLOCK_MONOTONIC; 1.0 without a TSC.
KVB_API double kvb_ns_per_tick() {
#if KVB_HAVE_TSC
    double rates[5];
    for (double& rate : rates) {
        int64_t c0 = Tsc::now(), t0 = monotonic_ns(), t1 = t0;
        while ((t1 = monotonic_ns()) - t0 < 20000000) {
        }
        int64_t c1 = Tsc::now();
        rate = static_cast<double>(t1 - t0) / static_cast<double>(c1 - c0);
    }
    std::sort(rates, rates + 5);
    return rates[2];
#else
    return 1.0;
#endif
}

// Fills out[0:n] with the ticks of an empty timed region (two clock reads), for the harness-overhead figure.
KVB_API void kvb_empty_regions(int64_t n, int64_t use_tsc, int64_t* out) {
    bool tsc = use_tsc != 0 && KVB_HAVE_TSC;
    for (int64_t i = 0; i < n; ++i) {
        int64_t t0 = tsc ? Tsc::now() : Steady::now();
        int64_t t1 = tsc ? Tsc::now() : Steady::now();
        out[i] = t1 - t0;
    }
}

// Replays steps [lo, hi) of a trace on the manager h of the design whose functions are in *ops. ticks_out
// [hi - lo, NKINDS] (zeroed by the caller), cows_out and allocs_out [hi - lo], capacity out_steps; cow_buf
// [cap, 2] and slot_buf [cap] scratch. use_tsc selects the clock (TSC ticks, else steady_clock ns). Returns 0,
// or a status with status_out = {status, step, op index}.
KVB_API int64_t kvb_replay(const DesignOps* ops, void* h, const uint8_t* op, const int32_t* a0, const int32_t* a1,
                           int64_t num_ops, const int64_t* step_offsets, const int64_t* decode_offsets,
                           int64_t num_steps, int64_t lo, int64_t hi, int64_t detail, int64_t use_tsc,
                           int64_t* cow_buf, int64_t* slot_buf, int64_t cap, int64_t* ticks_out, int64_t* cows_out,
                           int64_t* allocs_out, int64_t out_steps, int64_t* status_out) {
    TraceView t{op, a0, a1, num_ops, step_offsets, decode_offsets, num_steps};
    ReplayOut o{cow_buf, slot_buf, cap, ticks_out, cows_out, allocs_out, out_steps, {0, 0, 0}};
    bool tsc = use_tsc != 0 && KVB_HAVE_TSC;
    int64_t rc = tsc ? replay<Tsc>(*ops, h, t, lo, hi, detail != 0, o) : replay<Steady>(*ops, h, t, lo, hi, detail != 0, o);
    status_out[0] = rc;
    status_out[1] = o.status[1];
    status_out[2] = o.status[2];
    return rc;
}

KVB_API int64_t kvb_replay_abi_version() { return 1; }
