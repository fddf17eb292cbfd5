"""Each primitive's async form under its plain name (the async side of the compat seam).

Both forms of every primitive live side by side in ``etcdfence/_acompat.py``; this
table picks one form of each. ``tools/async_to_sync.py`` makes ``_sync/_compat.py``
from ``_async/_compat.py`` through its names map, so the modules of both twins say
``_compat.Event`` and each gets its own side's form.
"""

from __future__ import annotations

from .. import _acompat as _c

IS_ASYNC = _c.AIS_ASYNC
monotonic = _c.monotonic

Event = _c.AEvent
Lock = _c.ALock
Queue = _c.AQueue
Slots = _c.ASlots
Signal = _c.ASignal
Channel = _c.AChannel
Aborted = _c.AAborted

still_wanted = _c.astill_wanted
uncancellable = _c.auncancellable
sleep = _c.asleep
wait_event = _c.await_event
queue_get = _c.aqueue_get
queue_put = _c.aqueue_put
run_blocking = _c.arun_blocking
spawn = _c.aspawn
settle = _c.asettle
outcome = _c.aoutcome
owner_loop = _c.aowner_loop
call_threadsafe = _c.acall_threadsafe
Background = _c.ABackground
run_term = _c.arun_term
run_callback = _c.arun_callback

new_channel = _c.anew_channel
close_channel = _c.aclose_channel
unary = _c.aunary
Stream = _c.AStream
