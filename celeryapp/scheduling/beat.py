"""The beat scheduler: RedBeat, made to survive lost locks and Redis restarts.

``celery -A celeryapp beat`` uses :class:`ChordbeatScheduler` (set in the app's config). On start it
waits for Redis as long as it is away (as a worker does), applies the schedule file (if any) and
repairs the entries from the database before the first tick; each fire message carries the
nominal slot it stands for, which makes the run key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from celery.signals import beat_init
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, RedBeatScheduler, acquire_distributed_beat_lock
from redbeat.schedulers import get_redis as redbeat_client

from celeryapp.clock import clock
from celeryapp.errors import DefinitionError
from celeryapp.messaging.broker import RECONNECT_INTERVAL_MAX_S
from celeryapp.messaging.redis_client import get_redis
from celeryapp.monitoring import health
from celeryapp.monitoring.watchdog import StallWatchdog
from celeryapp.runtime import Runtime
from celeryapp.scheduling import entry_batches
from celeryapp.scheduling.beat_entries import reconcile, reconcile_fully_next
from celeryapp.scheduling.beat_lock import holder_token
from celeryapp.scheduling.calendar_files import unreadable_calendars
from celeryapp.scheduling.fire_messages import FireSender
from celeryapp.scheduling.redis_outage import RedisOutage
from celeryapp.scheduling.schedule_file import apply_file
from celeryapp.scheduling.stored_entry import CadenceSchedule, CorruptEntry, ScheduleEntry, wrong_type
from models.audit import BEAT

logger = logging.getLogger(__name__)

#: Seconds between two tries at (re)taking the lock while another beat holds it or Redis is down.
LOCK_RETRY_S = 1.0
#: Seconds between two extensions of the lock (and writes of the liveness file).
KEEPALIVE_S = 1.0
#: A standby beat writes its liveness file this often while it waits for the lock.
STANDBY_TOUCH_S = 5.0
#: Shortest sleep between ticks: entries due within it are sent together by the next tick (a
#: fire at most this late) instead of one tick each, which cost beat twice the CPU with many
#: schedules (docs/performance.md, "Why fires are on time").
MIN_TICK_S = 0.1
#: First pause between two tries at reaching Redis while beat starts; each try waits half a
#: second longer, up to the broker's own longest pause between reconnections.
START_RETRY_FIRST_S = 0.5
#: Unreadable entries a beat remembers having reported (each is logged at ERROR once); past this
#: many (someone writing garbage in bulk) it forgets them and reports again.
REPORTED_MAX = 10_000


class ChordbeatScheduler(RedBeatScheduler):  # type: ignore[misc]
    Entry = ScheduleEntry
    _needs_repair = False
    _kept_alive_at = float("-inf")
    #: Armed when beat's service starts (:func:`take_lock_at_start`); a scheduler built elsewhere
    #: (tests, tools) is watched by nothing.
    watchdog: StallWatchdog | None = None
    #: Set by Celery's scheduler from the app beat runs in.
    app: Runtime

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._reported: set[str] = set()
        self._fires = FireSender()
        # Each thing beat keeps trying while Redis is away says so once, not every second.
        self._locking = RedisOutage(
            logger, "beat: cannot reach Redis for the lock; retrying", "trying for the lock again"
        )
        self._extending = RedisOutage(
            logger, "beat: cannot reach Redis to extend the lock; retrying", "the lock is extended again"
        )
        self._ticking = RedisOutage(logger, "beat: Redis error during tick; retrying shortly", "ticking again")
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        # RedBeat's start-up reads and writes Redis; with Redis away beat exited
        # ("beat raised exception ConnectionError") where a worker waits for it.
        self._until_redis_answers(super().setup_schedule)
        settings = self.app.settings
        try:
            if settings.schedules_file:
                apply_file(self.app, settings.schedules_file, actor=BEAT)
        except DefinitionError as exc:
            # Refuse the whole file but keep scheduling what is stored: a crash-looping beat
            # would stop every schedule, not just the broken one.
            logger.error("beat: schedule file %s NOT applied, nothing changed: %s", settings.schedules_file, exc)
        except Exception:
            logger.exception("beat: schedule file %s NOT applied (database or Redis trouble)", settings.schedules_file)
        self._say_unreadable_calendars()
        if self.app.redbeat_conf.lock_key:  # self.lock_key is not set yet: RedBeat sets it after this
            # Entries are repaired once the lock is ours (see _take_lock): a standby may wait for
            # it while Redis restarts empty, and whatever it wrote now would be gone by then.
            return
        try:
            reconcile(self.app, full=True)
        except Exception:
            # Redis or the database away at start: beat still starts; the periodic reconcile repairs.
            logger.exception("beat: could not repair entries at start; the periodic reconcile will")

    def _say_unreadable_calendars(self) -> None:
        """Loudly, at start: the slots of a schedule whose named calendar cannot be read start
        nothing (each is recorded skipped_calendar with the reason) until the file is fixed."""
        settings = self.app.settings
        try:
            problems = unreadable_calendars(settings.database_url, settings.calendars_dir)
        except Exception:
            logger.exception("beat: could not check the schedules' calendars (database trouble)")
            return
        for problem in problems:
            logger.error("beat: %s; its slots start nothing until the calendar can be read", problem)

    def _until_redis_answers(self, start: Callable[[], None]) -> None:
        """Run ``start`` (all of it again after each failure: RedBeat's start-up may be repeated)
        until Redis lets it through.

        The wait keeps the liveness file fresh (and would feed the stall watchdog, armed only
        later): a beat waiting for Redis is alive, and a probe restarting it would only start
        another wait.
        """
        outage = RedisOutage(logger, "beat: waiting for Redis to start", "starting")
        pause_s = START_RETRY_FIRST_S
        while True:
            try:
                start()
            except redis.RedisError as exc:
                outage.failed(exc)
                self._alive()
                time.sleep(pause_s)
                pause_s = min(pause_s + START_RETRY_FIRST_S, RECONNECT_INTERVAL_MAX_S)
                continue
            outage.answered()
            return

    @property
    def schedule(self) -> dict[str, Any]:
        """The entries due now, and the next one (to know how long to sleep).

        RedBeat's own selects by the current whole second; entries are scored by their exact due
        time (:attr:`ScheduleEntry.score`), so select by the exact time too: only what is due is
        loaded, each entry once, and :data:`~.entry_batches.CHUNK` of them a command (RedBeat: one
        each).
        """
        now = self.app.now().timestamp()
        client = get_redis(self.app.settings.redbeat_url)
        index_key = self.app.redbeat_conf.schedule_key
        with client.pipeline() as pipe:
            pipe.zrangebyscore(index_key, 0, now)
            pipe.zrangebyscore(index_key, f"({now!r}", now + self.max_interval, start=0, num=1)
            due_keys, next_keys = pipe.execute()
        entries: dict[str, Any] = {}
        keys = due_keys + next_keys
        for key, fields in zip(keys, entry_batches.load(client, keys), strict=True):
            try:
                if wrong_type(fields):
                    raise CorruptEntry("it is not a hash")
                definition, meta = fields
                if not definition:
                    logger.warning("beat: failed to load %s, removing it from the index", key)
                    client.zrem(index_key, key)
                    continue
                entry = self.Entry.from_stored(definition, meta, app=self.app, key=key)
            except CorruptEntry as exc:
                self._drop(key, str(exc))
                continue
            entries[entry.name] = entry
        return entries

    def _drop(self, key: str, why: str) -> None:
        """Take an entry beat cannot work with out of its index: left there, it made every tick
        fail and beat exit, stopping every schedule. The database is the source of truth: the
        next periodic reconcile is made a full one, which writes the entry again; beat's own
        entries (recovery, reconcile...) are written again by the repair before the next tick."""
        redbeat_client(self.app).zrem(self.app.redbeat_conf.schedule_key, key)
        reconcile_fully_next(self.app)
        if key in {self.Entry.generate_key(self.app, name) for name in self.app.redbeat_conf.schedule}:
            self._needs_repair = True
        if key in self._reported:
            # Written again from a database row that gives the same trouble: said already.
            logger.info("beat: entry %s dropped again: %s", key, why)
            return
        if len(self._reported) >= REPORTED_MAX:
            self._reported.clear()
        self._reported.add(key)
        logger.error("beat: entry %s cannot be used and is dropped until it is written again: %s", key, why)

    def _repair(self) -> None:
        """After the lock was lost Redis may have lost everything: internal entries included."""
        try:
            self.update_from_dict(self.app.redbeat_conf.schedule)
            reconcile(self.app, full=True)
        except Exception:
            # Redis or the database still away: beat must outlive both, so it retries next tick.
            logger.exception("beat: repairing entries after re-taking the lock failed; the next tick retries")
            self._needs_repair = True
        else:
            self._needs_repair = False

    def _alive(self) -> None:
        """The loop came round: the liveness file and the watchdog say so."""
        health.touch(self.app.settings, "beat")
        if self.watchdog is not None:
            self.watchdog.feed()

    def close(self) -> None:
        # A shutdown that hangs is ended by the watchdog too; one that returns leaves nothing armed.
        super().close()
        if self.watchdog is not None:
            self.watchdog.disarm()

    def _take_lock(self) -> None:
        """Block until this beat holds the lock: standby beats wait here.

        Every time the lock is taken the entries are repaired before the next fire: while this
        beat waited, Redis may have restarted empty (the lock vanishing with it is what let us
        in), taking every entry with it, the recovery task's own included.

        A standby is alive and ready: it keeps its liveness file fresh while it waits, or a
        liveness probe (``chordbeat health beat``) would restart it over and over.
        """
        client = redbeat_client(self.app)
        standing_by = False
        while True:
            self._alive()
            try:
                lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=LOCK_RETRY_S)
                lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
                # The first try does not wait: a standby says so at once.
                acquired = lock.acquire(blocking=standing_by, blocking_timeout=STANDBY_TOUCH_S, token=holder_token())
                self._locking.answered()
                if not acquired:
                    if not standing_by:
                        logger.info("beat: another beat holds the lock; standing by")
                        standing_by = True
                    continue
            except redis.RedisError as exc:
                self._locking.failed(exc)
                time.sleep(LOCK_RETRY_S)
                continue
            self.lock = lock
            self._needs_repair = True
            logger.info("beat: acquired lock")
            return

    def tick(self, min: Any = min, **kwargs: Any) -> float:
        # Entries falling due back to back make hundreds of ticks a second: the liveness file and
        # the lock are kept up at most once a KEEPALIVE_S. The lock cannot lapse in between (it
        # lives lock_timeout), and after a long pause (SIGSTOP) the first tick extends it at once.
        if time.monotonic() - self._kept_alive_at >= KEEPALIVE_S:
            self._alive()
            if self.lock_key:
                try:
                    if self.lock is None:
                        raise redis.exceptions.LockError("no lock held")
                    self.lock.extend(int(self.lock_timeout))
                    self._extending.answered()
                except redis.exceptions.LockError as exc:
                    # Lost for good (expired, taken over, or Redis came back without it): go back
                    # to standby instead of exiting, and repair entries once the lock is ours again.
                    self._extending.answered()
                    logger.warning("beat: lost the lock (%s); waiting to take it again", exc)
                    self.lock = None
                    self._take_lock()
                except redis.RedisError as exc:
                    # Redis unreachable: keep the lock (its token). If Redis comes back with its
                    # data before the lock expires, extending it goes on as if nothing happened;
                    # taking a new one would wait for our own old lock to expire first.
                    self._extending.failed(exc)
                    self._needs_repair = True
                    return LOCK_RETRY_S
            # Beat reckons every slot by the reference clock: its offset is read again each time
            # round (after a Redis failover the reference is another host's clock).
            clock.measure()
            self._kept_alive_at = time.monotonic()
        if self._needs_repair:
            self._repair()
        try:
            started = self.app.now().timestamp()
            self._fires.release(self.app, producer=self.producer)
            # RedBeat's tick without its lock extension (done above).
            remaining: list[float] = [float(self.max_interval)]
            fires: list[ScheduleEntry] = []
            for entry in self.schedule.values():
                next_time_to_run = self._due_in(entry, fires)
                if next_time_to_run:
                    remaining.append(float(next_time_to_run))
            if fires:
                self._fires.send(self.app, fires, producer=self.producer, drop=self._drop)
            remaining.append(self._until_next_entry(started))
            self._ticking.answered()
            return max(float(min(remaining)), MIN_TICK_S)
        except redis.RedisError as exc:
            self._ticking.failed(exc)
            return LOCK_RETRY_S

    def _due_in(self, entry: ScheduleEntry, fires: list[ScheduleEntry]) -> float | None:
        """Seconds until ``entry`` is due again; due now, a schedule's entry joins ``fires`` and
        beat's own (recovery, reconcile, housekeeping) is sent at once."""
        try:
            if isinstance(entry.schedule, CadenceSchedule):
                is_due, next_time_to_run = entry.is_due()
                if is_due:
                    fires.append(entry)
                return float(next_time_to_run)
            return self.maybe_due(entry, **self._maybe_due_kwargs)  # type: ignore[no-any-return]
        except redis.RedisError:
            raise
        except Exception as exc:
            # Read fine, yet its due time cannot be reckoned (an instant out of range).
            self._drop(entry.key, f"its due time cannot be computed ({exc!r})")
            return None

    def _until_next_entry(self, started: float) -> float:
        """Seconds until the first entry due after the tick began.

        RedBeat sleeps until the next entry it loaded, or for max_interval when that one fell due
        (and was sent) while the tick worked: under load, every entry due after it then waited
        for max_interval (5 s late). Entries due before the tick began were handled by it.
        """
        client = redbeat_client(self.app)
        head = client.zrangebyscore(
            self.app.redbeat_conf.schedule_key, f"({started!r}", "+inf", start=0, num=1, withscores=True
        )
        if not head:
            return float(self.max_interval)
        return max(float(head[0][1]) - float(self.app.now().timestamp()), 0.0)


# RedBeat's own start-up handler polls for the lock every beat_max_loop_interval (5 s); ours polls
# every second, so a standby takes over sooner after the holder dies.
beat_init.disconnect(acquire_distributed_beat_lock)


@beat_init.connect
def take_lock_at_start(sender: Any = None, **_: Any) -> None:
    scheduler = sender.scheduler
    if not isinstance(scheduler, ChordbeatScheduler):
        return
    watchdog = StallWatchdog(scheduler.app.settings.beat_stall_s)
    if watchdog.arm():
        scheduler.watchdog = watchdog
    if scheduler.lock_key:
        scheduler._take_lock()
