/* Valgrind client requests that switch callgrind's counting on and off around a measured region.
 *
 * Hand-written and compiled at run time (harness/callgrind.py) because no maintained Python package exposes
 * valgrind's client requests. Outside valgrind every request is a short sequence of no-op instructions, so
 * the same process can run natively (to warm Numba's cache) and under callgrind.
 */
#include <valgrind/callgrind.h>

/* Start simulating (and counting) guest instructions; translations are flushed, counts are not reset. */
void kvb_instrument(void) { CALLGRIND_START_INSTRUMENTATION; }

/* Reset every counter to zero; the simulated caches keep their contents. */
void kvb_zero(void) { CALLGRIND_ZERO_STATS; }

/* Stop counting, then write the counts since the last reset to a new dump file tagged with `label`. */
void kvb_stop(const char *label) {
    CALLGRIND_STOP_INSTRUMENTATION;
    CALLGRIND_DUMP_STATS_AT(label);
}

/* 1 under valgrind, 0 natively. */
int kvb_on_valgrind(void) { return RUNNING_ON_VALGRIND ? 1 : 0; }
