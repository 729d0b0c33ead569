"""Beat's reads and writes of many entries at once: one Redis command per chunk of entries.

A tick loads the entries due and, once it has fired them, moves each on (its last fire time and
its score in the schedule index), as RedBeat does one entry at a time. One command per entry
(``HMGET``, then ``HSET`` and ``ZADD``) made the client's packing and parsing of commands most of
beat's CPU at 1,667 fires a second (docs/scaling.md, "Beat's CPU"); a script per chunk does the
same work on the server, with the same outcome for every entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from celeryapp.messaging.redis_client import registered_script

#: Entries one command reads or writes: a script holds Redis about a millisecond per thousand,
#: and its reply is a few hundred KiB.
CHUNK = 1000

#: KEYS: entries. Per entry its definition and meta (nil where missing), or the error Redis gave
#: (a key that is not a hash), as the entry's own reply: one bad key spoils no other.
_LOAD_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.pcall('HMGET', key, 'definition', 'meta')
end
return out
"""

#: KEYS[1]: the schedule index; KEYS[2..]: the entries fired. ARGV: each one's meta and score.
_MOVE_ON_LUA = """
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], 'meta', ARGV[2 * i - 3])
  redis.call('ZADD', KEYS[1], ARGV[2 * i - 2], KEYS[i])
end
return #KEYS - 1
"""


def load(client: redis.Redis, keys: Sequence[str]) -> list[Any]:
    """Each entry's ``[definition, meta]`` (``None`` where missing), or a :class:`redis.ResponseError`
    where the key is not a hash, in the order of ``keys``."""
    script = registered_script(client, _LOAD_LUA)
    replies: list[Any] = []
    for start in range(0, len(keys), CHUNK):
        replies.extend(script(keys=list(keys[start : start + CHUNK])))
    return replies


def move_on(client: redis.Redis, index_key: str, moves: Sequence[tuple[str, str, float]]) -> None:
    """Store each ``(entry key, meta, score)``: the entry's meta written and its score in the index."""
    script = registered_script(client, _MOVE_ON_LUA)
    for start in range(0, len(moves), CHUNK):
        chunk = moves[start : start + CHUNK]
        script(
            keys=[index_key, *(key for key, _, _ in chunk)],
            args=[value for _, meta, score in chunk for value in (meta, repr(score))],
        )
