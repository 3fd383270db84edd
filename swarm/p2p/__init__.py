"""A peer on the hivemind swarm: the DHT (its own process with p2pd) plus our P2P RPC handlers.

hivemind is asyncio; the roles are plain blocking code. `SwarmNode` runs one event loop in a
background thread and exposes blocking calls that always take a timeout. Payloads are raw bytes
(msgpack) carried in protobuf `BytesValue`, so no .proto files are needed. One RPC reply is capped
at 4 MiB by hivemind, so callers keep messages under `MAX_MESSAGE`.

  node.py      `SwarmNode`: the facade the roles use, composed of the parts below
  loop.py      the bridge: one asyncio loop in a thread, blocking runs with a timeout
  framing.py   the bytes of our streamed and gated calls (hivemind's protobuf stream, by hand)
  handlers.py  serving: unary, streaming and gated handlers
  budget.py    the inbound streams a peer and all peers may hold open (open-file limit)
  doors.py     every door's budget (`DOORS`): calls and bytes per peer and for all unproven keys, the tarpit
  calls.py     calling: unary, streamed and gated calls, routed to peers we have no route to yet
  changes.py   `Changes`: wakes handlers in the loop when another thread changes what they wait for
"""

from swarm.p2p.budget import StreamBudget, raise_nofile_limit
from swarm.p2p.calls import call_gated
from swarm.p2p.doors import DOORS, INF, Bound, Door, DoorBudget, Doors
from swarm.wire import MAX_MESSAGE
from swarm.p2p.framing import NotAnswered, RemoteError, Stall, StreamStalled
from swarm.p2p.handlers import Gate, Handler, StreamHandler
from swarm.p2p.loop import CallStopped
from swarm.p2p.node import SwarmNode

__all__ = ["DOORS", "INF", "MAX_MESSAGE", "Bound", "CallStopped", "Door", "DoorBudget", "Doors", "Gate", "Handler",
           "NotAnswered", "RemoteError", "Stall", "StreamBudget", "StreamHandler", "StreamStalled", "SwarmNode", "call_gated",
           "raise_nofile_limit"]
