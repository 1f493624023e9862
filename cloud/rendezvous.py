"""Where a launched fleet meets: two signed records in the run's store, which every node reaches.

SkyPilot 0.14.1 gives a job group's tasks host names (`head-0.NAME`) only on Kubernetes
(`sky/optimizer.py`: "in-group service discovery ... is only supported on Kubernetes"); on AWS and
GCP a spot node has no name for its head. The store is the one place every node already reaches,
so the head writes there:

- `fleet/head.json` — the head's internal address and Ray port, and a **generation**: one more than
  the record it replaces. A head that SkyPilot restarts or recovers (a new machine, a new address)
  publishes the next generation; spot nodes that see the generation change re-join.
- `fleet/done.json` — written once the run has ended for good (finished, out of budget, or failed
  in a way a restart cannot cure). A spot task exits 0 only when this is there: an exit 0 is what
  tells SkyPilot not to relaunch it. The head removes it when it starts (a re-launched run goes on).

Each record is {"record": {...}, "hmac": HEX}: HMAC-SHA256 of the record's canonical JSON, keyed
by the fleet's Ray token. Anyone who can write to the bucket can write a record, but only a holder
of the token can sign one; a node reads a record only through `verify`, so a forged head address
is never dialled — the token (which `ray start` sends) never leaves for an address the fleet did
not publish. The record names its run, so a record of another run with the same store is refused
too.

A signature does not date a record: a store writer without the token can save a genuine head
record and write it back after the head moved on. So a `Rendezvous` keeps the highest generation it
has verified: a head record below it is a replay (refused; the newest known head stands), a done
record counts only at or above the current head's generation (read first), and a head publishes
above every generation it has seen.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from cloud.bounded_json import loads
from cloud.store import MissingKey, ObjectTooLarge, Store

logger = logging.getLogger(__name__)

HEAD_KEY = "fleet/head.json"
DONE_KEY = "fleet/done.json"
MAX_RECORD_BYTES = 4096
"""A record is about 200 bytes; anything much larger is not one of ours."""
REFUSALS_KEPT = 256
"""Distinct refused records remembered (their digests), so each is logged once: a store writer
cycling 2,000 forgeries had 2,000 kept whole (7.5 MB) and as many warning lines."""
REFUSALS_LOGGED = 20
"""Refused records logged one line each; after that, one line says that more are only counted."""
MAX_REASON = 500
"""Characters of a done record's reason kept: escaped as \\uXXXX they still fit in `MAX_RECORD_BYTES`."""


class ForgedRecord(ValueError):
    """A fleet record whose signature does not verify with the fleet's token (or that is not a
    record at all); the message is one line naming the key."""


@dataclass(frozen=True)
class HeadRecord:
    run: str
    generation: int
    address: str
    port: int
    published_at: float


@dataclass(frozen=True)
class DoneRecord:
    run: str
    reason: str
    exit_code: int
    generation: int
    at: float


_R = TypeVar("_R", HeadRecord, DoneRecord)
_TYPES = {"str": str, "int": int, "float": float}
"""The fields' declared types (strings: `from __future__ import annotations`) -> their converters."""


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _mac(record: dict[str, Any], token: str) -> str:
    return hmac.new(token.encode(), _canonical(record), hashlib.sha256).hexdigest()


def signed(record: dict[str, Any], token: str) -> bytes:
    """The stored form of `record`, signed with `token`."""
    return json.dumps({"record": record, "hmac": _mac(record, token)}, indent=1).encode()


def verify(blob: bytes, token: str, key: str) -> dict[str, Any]:
    """The record in `blob` when its signature verifies with `token`; else `ForgedRecord`."""
    try:
        # Bounded: 4 KiB of `[` is 4,096 levels, past json's ~1,000 (a RecursionError: issue 27).
        data = loads(blob, max_bytes=MAX_RECORD_BYTES, what="record")
        record, mac = data["record"], data["hmac"]
        if not isinstance(record, dict) or not isinstance(mac, str):
            raise TypeError("not a signed record")
    except (ValueError, KeyError, TypeError) as err:
        raise ForgedRecord(f"{key}: not a fleet record ({type(err).__name__}: {str(err)[:80]})") from None
    if not hmac.compare_digest(_mac(record, token), mac):
        raise ForgedRecord(f"{key}: its signature does not verify with this fleet's token (forged, or another fleet's)")
    return record


class Rendezvous:
    """The fleet records of run `run` in `store`, signed and verified with `token`. A record that is
    refused is logged, as a warning, once per distinct record."""

    def __init__(self, store: Store, token: str, run: str,
                 wall: Callable[[], float] = time.time) -> None:
        if not token:
            raise ValueError("Rendezvous: the fleet's token is empty")
        self.store = store
        self.token = token
        self.run = run
        self.wall = wall
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self.refusals = 0
        """Distinct records refused so far (logged up to `REFUSALS_LOGGED`)."""
        self.highest = 0
        """The highest head generation verified here: a record below it is a replay."""
        self._newest: HeadRecord | None = None

    def _read(self, key: str) -> dict[str, Any] | None:
        try:
            blob = self.store.get(key, max_bytes=MAX_RECORD_BYTES)
        except MissingKey:
            return None
        except ObjectTooLarge as err:  # not read: no record of ours is that large
            # Logged once per distinct message, as a refused record is once per distinct blob.
            self._refuse(str(err).encode(), ForgedRecord(f"{key}: not a fleet record (over {MAX_RECORD_BYTES} "
                                                         "bytes, not read)"))
            return None
        try:
            record = verify(blob, self.token, key)
            if record.get("run") != self.run:
                raise ForgedRecord(f"{key}: a record of run {str(record.get('run'))[:60]!r}, not {self.run!r}")
            return record
        except ForgedRecord as err:
            self._refuse(blob, err)
            return None

    def _refuse(self, seen: bytes, err: ForgedRecord) -> None:
        digest = hashlib.sha256(seen).digest()
        if digest in self._refused:
            return
        self._refused[digest] = None
        if len(self._refused) > REFUSALS_KEPT:
            self._refused.popitem(last=False)
        self.refusals += 1
        if self.refusals <= REFUSALS_LOGGED:
            logger.warning(f"refused {self.store.uri}/{err}")
        if self.refusals == REFUSALS_LOGGED:
            logger.warning(f"{self.store.uri}/fleet: {REFUSALS_LOGGED} records refused; further ones are counted, "
                           "not logged (someone without the fleet's token writes to the store)")

    @staticmethod
    def _typed(kind: type[_R], record: dict[str, Any] | None) -> _R | None:
        """`record` as a `kind` (each field converted to its declared type), None when it is not one."""
        try:
            return None if record is None else kind(**{f.name: _TYPES[f.type](record[f.name]) for f in fields(kind)})
        except (KeyError, TypeError, ValueError):
            return None

    # ---- the head -------------------------------------------------------------------------------

    def head(self) -> HeadRecord | None:
        """The head's published address, verified; None when there is none (or none that verifies).
        A record of a generation below the highest seen here is a replay: refused (logged once), and
        the newest head seen stands."""
        blob_record = self._read(HEAD_KEY)
        head = self._typed(HeadRecord, blob_record)
        if head is None:
            return None
        if head.generation < self.highest:
            self._refuse(_canonical(blob_record), ForgedRecord(
                f"{HEAD_KEY}: generation {head.generation} replayed after generation {self.highest} (an old record "
                "written back); the newest head stands"))
            return self._newest
        self.highest, self._newest = head.generation, head
        return head

    def publish_head(self, address: str, port: int) -> HeadRecord:
        """Publish this head at `address`:`port` as the next generation — above the store's and above
        every generation seen here; the run is no longer done."""
        previous = self.head()
        generation = max(previous.generation if previous else 0, self.highest) + 1
        self.store.delete(DONE_KEY)
        head = HeadRecord(self.run, generation, address, port, self.wall())
        self.store.put(HEAD_KEY, signed(asdict(head), self.token))
        self.highest, self._newest = generation, head
        return head

    # ---- the end --------------------------------------------------------------------------------

    def records(self) -> tuple[DoneRecord | None, HeadRecord | None]:
        """(the run's end record, the head), each verified, as a spot node polls them: the head read
        first, since a done record below its generation is an earlier head's, written back (refused:
        None, the run goes on). One read of each record."""
        head = self.head()
        blob_record = self._read(DONE_KEY)
        done = self._typed(DoneRecord, blob_record)
        if done is not None and done.generation < self.highest:
            self._refuse(_canonical(blob_record), ForgedRecord(
                f"{DONE_KEY}: a done record of generation {done.generation}, below the head's {self.highest} (an old "
                "record written back); the run goes on"))
            done = None
        return done, head

    def done(self) -> DoneRecord | None:
        """The run's end record, verified; None while the run is not done (`records`)."""
        return self.records()[0]

    def publish_done(self, reason: str, exit_code: int, generation: int) -> DoneRecord:
        """The run has ended for good (`reason`, at most `MAX_REASON` characters of it, is shown), at
        `generation` or the store's head's, whichever is higher (a head that failed before publishing
        itself ends the run of the generation it found)."""
        self.head()
        done = DoneRecord(self.run, reason[:MAX_REASON], exit_code, max(generation, self.highest), self.wall())
        self.store.put(DONE_KEY, signed(asdict(done), self.token))
        return done
