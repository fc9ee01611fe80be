-- dlcsniff.lua: Wireshark / tshark dissectors for what `dlcsniff decode` reads from TCP (written by
-- `dlcsniff wireshark`; Wireshark 4.0 or later, Lua 5.2).
--
--   zmtp    ZeroMQ's wire protocol (ZMTP 3.0/3.1 = RFC 23/37, 2.0 = RFC 15, 1.0 framing): greetings; commands
--           (READY/INITIATE properties, ERROR, PING, SUBSCRIBE/CANCEL, the PLAIN user name, never the
--           password; CURVE/GSSAPI commands named and sized, contents opaque); multipart messages
--   pslite  ps-lite messages on ZMTP: dmlc/ps-lite's protobuf meta (MXNet), bytedance/ps-lite's raw struct meta
--           (BytePS, its routed answers too), keys, lens, data frame sizes, the sender's and receiver's node
--           ids, the request type, dtype and tensor (MXNet's and BytePS's key layouts)
--   gloo    Gloo's TCP transport (PyTorch's CPU collectives): the connect sequence number, 48-byte preambles
--
-- Run it:   tshark -2 -X lua_script:dlcsniff.lua -r CAPTURE -Y pslite -T fields -e frame.number \
--               -e pslite.sender -e pslite.recver -e pslite.timestamp -e pslite.push -e pslite.request \
--               -e pslite.key -e pslite.data_sizes
--   -2: two passes. Node ids are known once the scheduler's ADD_NODE reply has been read, after each node's
--   first request: the first pass reads the whole capture, the second shows every message with all of it.
--   Nothing else to set (no -o tcp.reassemble_out_of_order, no Decode As): the script follows the TCP
--   connections itself (How, below). In the GUI (the script in the personal Lua plugin folder: `dlcsniff
--   wireshark --install`), open the capture: the packet details show everything once it has loaded.
--   Two messages completed by one packet give comma-joined values on one `-T fields` line (Wireshark's rule
--   for repeated fields); `-T json` or pdml keep one zmtp / pslite / gloo object per message.
--
-- Fields. zmtp.pdu (greeting, command, message, resync, failed), zmtp.flow (the TCP direction: the packet
-- showing a message may belong to the other one), zmtp.version, zmtp.mechanism, zmtp.socket_type,
-- zmtp.identity, zmtp.command, zmtp.property.name/value, zmtp.frames, zmtp.message_size, per frame
-- zmtp.frame > zmtp.flags (.more .long .command) and zmtp.size (and zmtp.body where kept), zmtp.complete,
-- zmtp.first_frame, zmtp.last_byte_frame (the packet that carried the last byte: its time is dlcsniff's
-- ts_last_ns). pslite.sender, pslite.recver (and _role), pslite.request, pslite.push, pslite.pull,
-- pslite.simple_app, pslite.control, pslite.head, pslite.timestamp, pslite.app_id, pslite.customer_id,
-- pslite.num_keys > pslite.key, pslite.lens > pslite.len, pslite.data_sizes (one per data frame),
-- pslite.size, pslite.req_type, pslite.dtype, pslite.tensor_key, pslite.part, pslite.server_rank,
-- pslite.flavor, pslite.routing_id, pslite.complete, pslite.flow, pslite.last_byte_frame, and the meta as
-- on the wire under pslite.meta.* (pslite.node.* for ADD_NODE's node list). gloo.opcode, gloo.slot
-- (.prefix: the collective, .tag: its sequence number, .delta), gloo.nbytes, gloo.length, gloo.offset,
-- gloo.roffset, gloo.missing_bytes, gloo.complete, gloo.pair_sequence, gloo.flow, gloo.last_byte_frame.
--
-- How. The script stands between IP and TCP (ip.proto 6; `frame.protocols` reads ip:dlcsniff:tcp): it reads
-- every TCP header, then hands the packet to Wireshark's TCP dissector unchanged (so disabling the
-- "dlcsniff" protocol disables TCP: remove the script instead). It reassembles the connections it decodes
-- with dlcsniff's own rules (decoders/tcp.py): segments captured out of order wait for the bytes before
-- them, retransmitted bytes count once, and a hole the capture never filled is declared lost once the
-- other side acknowledged past it and 50 ms of capture time went by (or at a reset, a new connection on
-- the same ports, the end of the capture, or 4 MiB buffered past it). Each TCP direction goes to the decoder
-- whose rules claim it (decoders/capture_decoder.py: a ZMTP greeting, TCPStore's first bytes, a Gloo
-- preamble; ZMTP found by resynchronisation for a connection caught mid-stream), and the decoders follow
-- decoders/protocols/zmtp/decoder.py, pslite.py and gloo.py: the messages shown are the rows of dlcsniff's
-- zmtp.parquet and messages.parquet, their node ids and tensors those of decoders/protocols/pslite/job.py. A message
-- is shown in the packet that completed it: the one carrying its last byte, or a later one that filled a
-- hole before it or showed it lost. Its kept frames (routing frame, meta, keys, lens, small bodies) form a
-- data source of their own ("ZMTP message (kept frames)"); tensor values are counted, never copied.
--
-- Holes. A message a capture hole cut short is shown as dlcsniff reports it: complete = false, the frame
-- sizes the ZMTP headers gave, and, where the hole took whole frames, the data frame sizes its meta
-- states (the lens frame one int32 per key, the values sum(lens) items); a size nothing states is listed
-- in pslite.data_size_unknown (its data frame index) instead of pslite.data_sizes. A hole over a frame
-- header loses the framing: the bytes after it are scanned for the next frame (zmtp.pdu == "resync").
--
-- Left out. NCCL (socket transport, bootstrap), PyTorch's TCPStore queries and RoCE: a TCPStore connection is
-- recognised (so that no other decoder takes it) but not shown; Wireshark dissects InfiniBand/RoCE itself.
-- Gloo ranks, process groups and collectives, which dlcsniff reads from the TCPStore rendezvous: the slot's
-- collective and sequence number are shown, and a Gloo connection is recognised by its first bytes only
-- (dlcsniff also by its listener's address in the rendezvous). MXNet row_sparse row ids and compressed element
-- counts. A connection caught mid-stream whose frames no ps-lite meta vouches for (dlcsniff takes it as plain
-- ZMTP when another connection to the same server opened with a greeting). IP fragments (dlcsniff skips them;
-- Wireshark reassembles them and this script then reads the whole segment). dlcsniff decodes a job's captures
-- together: a node id or tensor that only another node's capture tells is missing here. What only the end of
-- the capture completes (a hole never filled, a message cut by the capture's end) is shown by tshark -2 only:
-- a single pass never reaches it, and the GUI cannot know that a capture has ended. Without -2, a node's first
-- messages have no node ids; in the GUI the packet list may lack them too, the packet details have them.

-- Installed as a plugin and given with -X lua_script too: the copy loaded first serves; say which (each
-- script has an environment of its own, _G is the one they share).
local this_script = debug.getinfo(1, "S").source:gsub("^@", "")
if _G.dlcsniff_lua_script then
    error(string.format("dlcsniff.lua is loaded already, from %s: %s is not used", _G.dlcsniff_lua_script,
                        this_script))
end
_G.dlcsniff_lua_script = this_script

local sbyte, ssub, sfind, sformat, concat = string.byte, string.sub, string.find, string.format, table.concat
local floor, min, max = math.floor, math.min, math.max
local band = bit32.band

local tracker = Proto("dlcsniff", "dlcsniff TCP follower")
local zmtp = Proto("zmtp", "ZeroMQ Message Transport Protocol")
local pslite = Proto("pslite", "ps-lite")
local gloo = Proto("gloo", "Gloo TCP transport")

