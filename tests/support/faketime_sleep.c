/* Loaded before libfaketime in a skewed test process (tests/support/processes.py skewed()).
 *
 * libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 shifts the absolute deadline of a
 * monotonic clock_nanosleep by the fake offset: CPython's time.sleep() then fails with EINVAL.
 * Without that variable, pthread_cond_timedwait on the monotonic clock never wakes (every
 * threading wait hangs). A real skewed host has a true monotonic clock: sleep by the kernel's. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request, struct timespec *remain) {
    long failed = syscall(SYS_clock_nanosleep, clock_id, flags, request, remain);
    return failed ? errno : 0;
}
