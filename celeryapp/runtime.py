"""What the layers below the application need of the app they run in.

The Celery app (:class:`celeryapp.application.ChordbeatCelery`) is built at the top, from the
layers below; they are handed it as a :class:`Runtime` and see only these members, so they need
not import the application (a circle) and mypy checks each use (an untyped ``Celery`` would let
any attribute through). ``ChordbeatCelery`` matches it structurally: nothing inherits from it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.orm import Session

from celeryapp.config import Settings


class RedBeatConf(Protocol):
    """The part of RedBeat's configuration (``app.redbeat_conf``) chordbeat reads: where beat's
    entries and lock live in Redis, and the entries configured in Celery (``beat_schedule``)."""

    @property
    def key_prefix(self) -> str: ...

    @property
    def schedule_key(self) -> str: ...

    @property
    def lock_key(self) -> str | None: ...

    @property
    def schedule(self) -> Mapping[str, Any]: ...


class ChordBackend(Protocol):
    """The result backend's counting of a chord's parts (Celery's Redis backend)."""

    def set_chord_size(self, group_id: str, chord_size: int) -> None: ...

    # What set_chord_size writes, for writing many groups' sizes in one pipeline.
    client: Any
    chord_expires: float | None

    def get_key_for_group(self, group_id: str, key: str = "") -> bytes: ...

    def ensure(self, fun: Callable[..., Any], args: Sequence[Any], **policy: Any) -> Any: ...


@runtime_checkable
class Runtime(Protocol):
    """The app as the lower layers use it."""

    #: The deployment's settings (``CHORDBEAT_*``).
    settings: Settings

    def now(self) -> datetime:
        """The reference clock's time (:mod:`celeryapp.clock`)."""
        ...

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send a message for the task ``name``: beat's fires, the lost-slot re-fire."""
        ...

    def signature(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """A signature of the task ``name``: a step's runner, a group's advancement."""
        ...

    def producer_or_acquire(self, producer: Any = None) -> AbstractContextManager[Any]:
        """A producer from the pool: one for every part of a chord."""
        ...

    @property
    def backend(self) -> ChordBackend: ...

    @property
    def current_worker_task(self) -> Any:
        """The task this worker process is running (Celery's), ``None`` outside one."""
        ...

    @property
    def tasks(self) -> Mapping[str, Callable[..., Any]]:
        """The tasks this process registered, by name: what a step may run here."""
        ...

    @property
    def redbeat_conf(self) -> RedBeatConf: ...

    def alert_channels(self) -> frozenset[str] | None:
        """The channel names definitions may use (``None``: no channels file)."""
        ...

    def apply_file_limits(
        self,
        session: Session,
        limits: Sequence[Mapping[str, Any]],
        *,
        source: str,
        dry_run: bool,
        remove: bool | Collection[str],
    ) -> dict[str, list[str]]:
        """Make a schedule file's ``limits:`` (validated definitions) the limits of its ``source``,
        in the file's transaction: the names added, changed, removed, unchanged, kept and taken
        over. Limits are stored by the execution layer, beside the schedule file's."""
        ...
