/* Shifts a process's wall clock (CLOCK_REALTIME, gettimeofday, time) by an offset, for Redis.
 *
 * libfaketime 0.9.10 cannot start Debian's redis-server (jemalloc aborts on its recursive
 * clock_gettime calls), and a promoted replica on another host keeps its own clock: Redis stores key
 * expiry as an absolute Unix time, so what a test needs is a Redis whose clock is off, or jumps.
 * This shim asks the kernel directly (no malloc, no dlsym) and leaves the monotonic clocks true.
 *
 * The offset, in seconds (may be negative, fractional), is read from the file named by
 * CHORDBEAT_CLOCK_SHIFT_FILE, again at most every 50 ms of monotonic time, so that a test can make
 * the clock jump while the server runs; without the file (or the variable), CHORDBEAT_CLOCK_SHIFT_S. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_ns;
static long long checked_at_ns = -1;

static long long parse_seconds_ns(const char *text) {
    /* strtod may allocate for its locale on first use; a hand parser keeps the shim malloc-free. */
    int sign = 1;
    long long whole = 0, fraction = 0, scale = 1000000000LL;
    while (*text == ' ' || *text == '\t') text++;
    if (*text == '-' || *text == '+') sign = (*text++ == '-') ? -1 : 1;
    while (*text >= '0' && *text <= '9') whole = whole * 10 + (*text++ - '0');
    if (*text == '.') {
        text++;
        while (*text >= '0' && *text <= '9' && scale > 1) {
            scale /= 10;
            fraction += (*text++ - '0') * scale;
        }
    }
    return sign * (whole * 1000000000LL + fraction);
}

static long long monotonic_ns(void) {
    struct timespec now;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

static long long current_shift_ns(void) {
    long long now = monotonic_ns();
    if (checked_at_ns >= 0 && now - checked_at_ns < 50000000LL) return shift_ns;
    checked_at_ns = now;
    const char *path = getenv("CHORDBEAT_CLOCK_SHIFT_FILE");
    if (path != NULL) {
        int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char text[64];
            long got = syscall(SYS_read, fd, text, sizeof text - 1);
            syscall(SYS_close, fd);
            if (got > 0) {
                text[got] = '\0';
                shift_ns = parse_seconds_ns(text);
                return shift_ns;
            }
        }
    }
    const char *fixed = getenv("CHORDBEAT_CLOCK_SHIFT_S");
    shift_ns = fixed != NULL ? parse_seconds_ns(fixed) : 0;
    return shift_ns;
}

static int is_wall_clock(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *out) {
    long failed = syscall(SYS_clock_gettime, id, out);
    if (failed || !is_wall_clock(id)) return failed ? -1 : 0;
    long long total = out->tv_sec * 1000000000LL + out->tv_nsec + current_shift_ns();
    out->tv_sec = total / 1000000000LL;
    out->tv_nsec = total % 1000000000LL;
    return 0;
}

int gettimeofday(struct timeval *restrict out, void *restrict zone) {
    (void)zone;
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) return -1;
    if (out != NULL) {
        out->tv_sec = now.tv_sec;
        out->tv_usec = now.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out != NULL) *out = now.tv_sec;
    return now.tv_sec;
}
