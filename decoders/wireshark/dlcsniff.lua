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
-- decoders/protocols/zmtp.py, pslite.py and gloo.py: the messages shown are the rows of dlcsniff's
-- zmtp.parquet and messages.parquet, their node ids and tensors those of decoders/pslite_job.py. A message
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
-- Left out. NCCL (socket transport, bootstrap), PyTorch's TCPStore queries and RoCE: a TCPStore connection
-- is recognised (so that no other decoder takes it) but not shown; Wireshark dissects InfiniBand/RoCE
-- itself. Gloo ranks, process groups and collectives, which dlcsniff reads from the TCPStore rendezvous:
-- the slot's collective and sequence number are shown, and a Gloo connection is recognised by its first
-- bytes only (dlcsniff also by its listener's address in the rendezvous). MXNet row_sparse row ids and
-- compressed element counts. IP fragments (dlcsniff skips them; Wireshark reassembles them and this
-- script then reads the whole segment). dlcsniff decodes a job's captures together: a node id or tensor
-- that only another node's capture tells is missing here. What only the end of the capture completes (a
-- hole never filled, a message cut by the capture's end) is shown by tshark -2 only: a single pass never
-- reaches it, and the GUI cannot know that a capture has ended. Without -2, a node's first messages have no
-- node ids; in the GUI the packet list may lack them too, the packet details have them.

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

-- ---------------------------------------------------------------------------------------------------
-- Wire constants
-- ---------------------------------------------------------------------------------------------------

local TWO32 = 4294967296
local TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10

local FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04
local V3_RESERVED, V2_RESERVED = 0xF8, 0xFC          -- 2.0 has no COMMAND flag
local SIGNATURE_BYTES, GREETING_V3_BYTES, GREETING_V2_BYTES = 10, 64, 12
local HEADER_MAX_BYTES = 10
local COMMAND_BODY_CAP_BYTES = 65536                 -- larger command bodies are named and sized, not parsed
local ENCRYPTED_NAME_PREFIX_BYTES = 256              -- an encrypted frame is read only as far as its name
local RESYNC_MAX_FRAME_BYTES = TWO32                 -- larger "sizes" found by scanning are payload bytes
local RESYNC_CHAIN_FRAMES = 4
local RESYNC_WINDOW_BYTES = 1048576                  -- dlcsniff's ZMTP max_buffer
local VALIDATOR_PREFIX_BYTES = 65536
local PREFIX_BYTES = 64                              -- bytes a direction may show before a decoder claims it

local SOCKET_TYPES = { [0] = "PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB",
                       "XSUB", "STREAM" }
local KNOWN_COMMANDS = { READY = true, ERROR = true, HELLO = true, WELCOME = true, INITIATE = true,
                         MESSAGE = true, PING = true, PONG = true, SUBSCRIBE = true, CANCEL = true,
                         JOIN = true, LEAVE = true }
local ENCRYPTING = { CURVE = true, GSSAPI = true }
local METADATA_COMMANDS = { READY = true, INITIATE = true }

local K_EMPTY = 2147483647                           -- ps-lite's kEmpty: an unset id, head, timestamp...
local MAX_ROUTING_FRAME_BYTES = 12                   -- bytedance routing frame "ps" + up to 10 digits
local KEPT_FIRST_FRAMES, KEPT_BODY_BYTES = 2, 65536  -- decoders.protocols.ZMTP_KEPT_BODIES
local CONTROL_CMDS = { [0] = "EMPTY", "TERMINATE", "ADD_NODE", "BARRIER", "ACK", "HEARTBEAT", "BOOTSTRAP",
                       "ADDR_REQUEST", "ADDR_RESOLVED", "INSTANCE_BARRIER" }
local ADD_NODE, BARRIER, ACK, INSTANCE_BARRIER = 2, 3, 4, 9
local ROLES = { [0] = "server", "worker", "scheduler", "joint" }
local NODE_ROLES = { [0] = "server", "worker", "scheduler" }    -- pslite_job.py names these, numbers the rest
local DATA_TYPES = { [0] = "CHAR", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
                     "FLOAT", "DOUBLE", "OTHER" }
local DATA_TYPE_INT32, DATA_TYPE_UINT64 = 3, 8
local DATA_TYPE_ITEM_BYTES = { [0] = 1, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8 }
local SCHEDULER_ID = 1
-- MXNet 1.9.1 (src/kvstore/kvstore_dist_server.h, mshadow/base.h) and BytePS (server.h, common.h)
local REQUEST_TYPES = { [0] = "default", "row_sparse", "compressed" }
local MX_DTYPES = { [0] = "float32", "float64", "float16", "uint8", "int32", "int8", "int64", "bool", "int16",
                    "uint16", "uint32", "uint64", "bfloat16" }
local BYTEPS_DTYPES = { [0] = "float32", "float64", "float16", "uint8", "int32", "int8", "int64" }
local MX_SIMPLE_APP = { [0] = "controller", "set_multi_precision", "stop_server", "sync_mode",
                        "set_gradient_compression", "set_profiler_params" }
local MX_HOME_SERVER_FACTOR = 9973                   -- EncodeDefaultKey: server = (key * 9973) % servers

local GLOO_OPCODES = { [0] = "SEND_BUFFER", "SEND_UNBOUND_BUFFER", "NOTIFY_SEND_READY", "NOTIFY_RECV_READY" }
local GLOO_PREFIXES = { [0] = "p2p", "gather", "all_gather", "reduce", "all_reduce", "scatter", "broadcast",
                        "barrier", "all_to_all" }
local GLOO_PREAMBLE_BYTES, GLOO_SEQUENCE_BYTES = 48, 8
local GLOO_MAX_MESSAGE_BYTES = 2 ^ 48
local GLOO_MAX_SEQUENCE = 2 ^ 31
local TCPSTORE_VALIDATE = "\0\206\247\133\60"         -- VALIDATE (0) + magic 0x3C85F7CE, little-endian

-- ---------------------------------------------------------------------------------------------------
-- Fields
-- ---------------------------------------------------------------------------------------------------

local zf = {
    pdu = ProtoField.string("zmtp.pdu", "PDU"),   -- greeting, command, message, resync, failed
    flow = ProtoField.string("zmtp.flow", "TCP direction"),
    version = ProtoField.string("zmtp.version", "Version"),
    mechanism = ProtoField.string("zmtp.mechanism", "Mechanism"),
    as_server = ProtoField.bool("zmtp.as_server", "As server"),
    socket_type = ProtoField.string("zmtp.socket_type", "Socket type"),
    command = ProtoField.string("zmtp.command", "Command"),
    property = ProtoField.none("zmtp.property", "Property"),
    prop_name = ProtoField.string("zmtp.property.name", "Property name"),
    prop_value = ProtoField.string("zmtp.property.value", "Property value"),
    identity = ProtoField.string("zmtp.identity", "Identity"),
    error_reason = ProtoField.string("zmtp.error.reason", "Reason"),
    ping_ttl = ProtoField.uint16("zmtp.ping.ttl", "TTL (1/10 s)"),
    topic = ProtoField.bytes("zmtp.topic", "Topic"),
    username = ProtoField.string("zmtp.plain.username", "Username"),
    encrypted = ProtoField.bool("zmtp.encrypted", "Encrypted stream"),
    frames = ProtoField.uint32("zmtp.frames", "Frames"),
    message_size = ProtoField.uint64("zmtp.message_size", "Message size (frame bodies)"),
    frame = ProtoField.none("zmtp.frame", "Frame"),
    flags = ProtoField.uint8("zmtp.flags", "Flags", base.HEX),
    flag_more = ProtoField.bool("zmtp.flags.more", "More", 8, nil, FLAG_MORE),
    flag_long = ProtoField.bool("zmtp.flags.long", "Long", 8, nil, FLAG_LONG),
    flag_command = ProtoField.bool("zmtp.flags.command", "Command", 8, nil, FLAG_COMMAND),
    size = ProtoField.uint64("zmtp.size", "Size"),
    body = ProtoField.bytes("zmtp.body", "Body"),
    first_frame = ProtoField.framenum("zmtp.first_frame", "First byte in frame"),
    last_byte_frame = ProtoField.framenum("zmtp.last_byte_frame", "Last byte in frame"),
    complete = ProtoField.bool("zmtp.complete", "Complete (every byte captured)"),
    lost_bytes = ProtoField.uint64("zmtp.lost_bytes", "Bytes whose framing is unknown"),
    reason = ProtoField.string("zmtp.reason", "Why"),
}
zmtp.fields = zf

local pf = {
    -- one of each per message: what `dlcsniff decode` puts in messages.parquet
    flow = ProtoField.string("pslite.flow", "TCP direction"),
    flavor = ProtoField.string("pslite.flavor", "Flavor"),
    last_byte_frame = ProtoField.framenum("pslite.last_byte_frame", "Last byte in frame"),
    complete = ProtoField.bool("pslite.complete", "Complete (every byte captured)"),
    sender = ProtoField.int32("pslite.sender", "Sender node id"),
    recver = ProtoField.int32("pslite.recver", "Receiver node id"),
    sender_role = ProtoField.string("pslite.sender_role", "Sender role"),
    recver_role = ProtoField.string("pslite.recver_role", "Receiver role"),
    routing_id = ProtoField.string("pslite.routing_id", "Routing frame"),
    request = ProtoField.bool("pslite.request", "Request"),
    push = ProtoField.bool("pslite.push", "Push"),
    pull = ProtoField.bool("pslite.pull", "Pull"),
    simple_app = ProtoField.bool("pslite.simple_app", "SimpleApp"),
    head = ProtoField.int32("pslite.head", "Head"),
    timestamp = ProtoField.int32("pslite.timestamp", "Timestamp"),
    app_id = ProtoField.int32("pslite.app_id", "App id"),
    customer_id = ProtoField.int32("pslite.customer_id", "Customer id"),
    control = ProtoField.uint32("pslite.control", "Control command", base.DEC, CONTROL_CMDS),
    barrier_group = ProtoField.int32("pslite.barrier_group", "Barrier group"),
    size = ProtoField.uint64("pslite.size", "Message size (meta + data frames)"),
    data_sizes = ProtoField.uint64("pslite.data_sizes", "Data frame size"),
    data_size_unknown = ProtoField.uint32("pslite.data_size_unknown", "Data frame of unknown size (index)"),
    num_keys = ProtoField.uint32("pslite.num_keys", "Keys"),
    key = ProtoField.uint64("pslite.key", "Key"),
    lens = ProtoField.none("pslite.lens", "Lens"),
    len = ProtoField.int32("pslite.len", "Len"),
    req_type = ProtoField.string("pslite.req_type", "Request type (from the head)"),
    dtype = ProtoField.string("pslite.dtype", "Values dtype (from the head)"),
    app_command = ProtoField.string("pslite.simple_app_cmd", "MXNet SimpleApp command"),
    tensor_key = ProtoField.uint64("pslite.tensor_key", "Tensor key (MXNet key / BytePS declared tensor)"),
    part = ProtoField.uint32("pslite.part", "Part (BytePS partition / MXNet big-array slice)"),
    server_rank = ProtoField.uint32("pslite.server_rank", "Server rank"),
    -- the meta frame as it is on the wire
    meta = ProtoField.bytes("pslite.meta", "Meta"),
    m_head = ProtoField.int32("pslite.meta.head", "Head"),
    m_body = ProtoField.bytes("pslite.meta.body", "Body"),
    m_control = ProtoField.int32("pslite.meta.control.cmd", "Control command", base.DEC, CONTROL_CMDS),
    m_barrier_group = ProtoField.int32("pslite.meta.control.barrier_group", "Barrier group"),
    m_msg_sig = ProtoField.uint64("pslite.meta.control.msg_sig", "Message signature", base.HEX),
    node = ProtoField.bytes("pslite.node", "Node"),
    node_role = ProtoField.int32("pslite.node.role", "Role", base.DEC, ROLES),
    node_id = ProtoField.int32("pslite.node.id", "Id"),
    node_hostname = ProtoField.string("pslite.node.hostname", "Hostname"),
    node_port = ProtoField.int32("pslite.node.port", "Port"),
    node_is_recovery = ProtoField.bool("pslite.node.is_recovery", "Is recovery"),
    node_customer_id = ProtoField.int32("pslite.node.customer_id", "Customer id"),
    m_request = ProtoField.bool("pslite.meta.request", "Request"),
    m_push = ProtoField.bool("pslite.meta.push", "Push"),
    m_pull = ProtoField.bool("pslite.meta.pull", "Pull"),
    m_simple_app = ProtoField.bool("pslite.meta.simple_app", "SimpleApp"),
    m_app_id = ProtoField.int32("pslite.meta.app_id", "App id"),
    m_timestamp = ProtoField.int32("pslite.meta.timestamp", "Timestamp"),
    m_data_type = ProtoField.int32("pslite.meta.data_type", "Data type", base.DEC, DATA_TYPES),
    m_customer_id = ProtoField.int32("pslite.meta.customer_id", "Customer id"),
    m_data_size = ProtoField.int32("pslite.meta.data_size", "Data size"),
    m_priority = ProtoField.int32("pslite.meta.priority", "Priority"),
    m_key = ProtoField.uint64("pslite.meta.key", "Key (raw struct)"),
    m_addr = ProtoField.uint64("pslite.meta.addr", "Addr", base.HEX),
    m_val_len = ProtoField.int32("pslite.meta.val_len", "Val len"),
    m_option = ProtoField.int32("pslite.meta.option", "Option"),
    m_sid = ProtoField.int32("pslite.meta.sid", "Sid"),
    m_src_dev_type = ProtoField.int32("pslite.meta.src_dev_type", "Source device type"),
    m_src_dev_id = ProtoField.int32("pslite.meta.src_dev_id", "Source device id"),
    m_dst_dev_type = ProtoField.int32("pslite.meta.dst_dev_type", "Destination device type"),
    m_dst_dev_id = ProtoField.int32("pslite.meta.dst_dev_id", "Destination device id"),
}
pslite.fields = pf

local gf = {
    flow = ProtoField.string("gloo.flow", "TCP direction"),
    sequence = ProtoField.int64("gloo.pair_sequence", "Connect sequence number"),
    nbytes = ProtoField.uint64("gloo.nbytes", "Message bytes (preamble + payload)"),
    opcode = ProtoField.uint64("gloo.opcode", "Opcode", base.DEC, GLOO_OPCODES),
    slot = ProtoField.uint64("gloo.slot", "Slot", base.HEX),
    prefix = ProtoField.uint8("gloo.slot.prefix", "Collective", base.DEC, GLOO_PREFIXES),
    tag = ProtoField.uint32("gloo.slot.tag", "Tag (collective sequence number)"),
    delta = ProtoField.uint8("gloo.slot.delta", "Delta"),
    offset = ProtoField.uint64("gloo.offset", "Offset"),
    length = ProtoField.uint64("gloo.length", "Length"),
    roffset = ProtoField.uint64("gloo.roffset", "Remote offset"),
    missing_bytes = ProtoField.uint64("gloo.missing_bytes", "Payload bytes the capture lost"),
    first_frame = ProtoField.framenum("gloo.first_frame", "First byte in frame"),
    last_byte_frame = ProtoField.framenum("gloo.last_byte_frame", "Last byte in frame"),
    complete = ProtoField.bool("gloo.complete", "Complete (every byte captured)"),
    lost_bytes = ProtoField.uint64("gloo.lost_bytes", "Bytes skipped to find a preamble"),
    reason = ProtoField.string("gloo.reason", "Why"),
}
gloo.fields = gf

local ex = {
    incomplete = ProtoExpert.new("zmtp.expert.incomplete", "Not every byte of this message was captured",
                                 expert.group.SEQUENCE, expert.severity.WARN),
    resync = ProtoExpert.new("zmtp.expert.resync", "Framing lost: frame boundary found by scanning",
                             expert.group.SEQUENCE, expert.severity.WARN),
    failed = ProtoExpert.new("zmtp.expert.failed", "The stream stopped making sense",
                             expert.group.MALFORMED, expert.severity.WARN),
    gloo_incomplete = ProtoExpert.new("gloo.expert.incomplete", "Not every byte of this message was captured",
                                      expert.group.SEQUENCE, expert.severity.WARN),
    gloo_resync = ProtoExpert.new("gloo.expert.resync", "Framing lost: preamble found by scanning",
                                  expert.group.SEQUENCE, expert.severity.WARN),
}
zmtp.experts = { ex.incomplete, ex.resync, ex.failed }
gloo.experts = { ex.gloo_incomplete, ex.gloo_resync }

-- ---------------------------------------------------------------------------------------------------
-- Byte helpers over Lua strings (1-based indexes)
-- ---------------------------------------------------------------------------------------------------

local function u32le(s, i)
    local a, b, c, d = sbyte(s, i, i + 3)
    return a + b * 256 + c * 65536 + d * 16777216
end
local function i32le(s, i)
    local v = u32le(s, i)
    return v >= 2147483648 and v - TWO32 or v
end
local function u32be(s, i)
    local a, b, c, d = sbyte(s, i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
end
local function u64le_number(s, i)           -- exact below 2^53
    return u32le(s, i) + u32le(s, i + 4) * TWO32
end
local function u64le(s, i)
    return UInt64(u32le(s, i), u32le(s, i + 4))
end
local function i64le_number(s, i)
    local hi = u32le(s, i + 4)
    if hi >= 2147483648 then return -((TWO32 - 1 - hi) * TWO32 + (TWO32 - u32le(s, i))) end
    return hi * TWO32 + u32le(s, i)
end

local function unset(v) if v == K_EMPTY then return nil end return v end

local function printable(s)
    return (s:gsub("[^\32-\126]", function(c) return sformat("\\x%02x", sbyte(c)) end))
end

local function parse_identity(s)             -- "ps9" -> 9; nil for anything else
    local digits = s and s:match("^ps(%d+)$")
    if digits and #digits <= 10 then return tonumber(digits) end
    return nil
end

-- The bytes of a payload: a string, or a Tvb (the packet being dissected) read only when needed.
local function bytes_of(src, off, n)
    if n <= 0 then return "" end
    if type(src) == "string" then return ssub(src, off + 1, off + n) end
    return src:raw(off, n)
end

-- ---------------------------------------------------------------------------------------------------
-- ps-lite metas: dmlc/ps-lite's protobuf ps.PBMeta, bytedance/ps-lite's raw structs (decoders/protocols/pslite.py)
-- ---------------------------------------------------------------------------------------------------

-- A varint at s[i..e]: low 32 bits, high 32 bits, next index, minimal (no needless continuation byte).
-- Lua 5.2 numbers are doubles: a varint is read as two 32-bit halves.
local function varint(s, i, e)
    local lo, hi = 0, 0
    for k = 0, 9 do
        if i > e then return nil end
        local b = sbyte(s, i)
        i = i + 1
        local v = b % 128
        if k < 4 then
            lo = lo + v * 2 ^ (7 * k)
        elseif k == 4 then
            lo = lo + (v % 16) * 268435456
            hi = floor(v / 16)
        else
            hi = (hi + v * 2 ^ (7 * k - 32)) % TWO32
        end
        if b < 128 then return lo, hi, i, (k == 0 or b ~= 0) end
    end
    return nil
end

-- src/meta.proto (decoders/protocols/pslite_meta.py)
local PB_SCHEMA = {
    PBMeta = {
        [1] = { "head", "int32" }, [2] = { "body", "bytes" }, [3] = { "control", "PBControl" },
        [4] = { "request", "bool" }, [5] = { "push", "bool" }, [6] = { "simple_app", "bool" },
        [7] = { "app_id", "int32" }, [8] = { "timestamp", "int32" },
        [9] = { "data_type", "int32", repeated = true, packed = true },
        [10] = { "customer_id", "int32" }, [11] = { "data_size", "int32" }, [12] = { "pull", "bool" },
        [13] = { "priority", "int32" },
    },
    PBControl = {
        [1] = { "cmd", "int32", required = true }, [2] = { "node", "PBNode", repeated = true },
        [3] = { "barrier_group", "int32" }, [4] = { "msg_sig", "uint64" },
    },
    PBNode = {
        [1] = { "role", "int32", required = true }, [2] = { "id", "int32" }, [3] = { "hostname", "bytes" },
        [4] = { "port", "int32" }, [5] = { "is_recovery", "bool" }, [10] = { "customer_id", "int32" },
    },
}

-- Parse message `name` from s[i..e]. Returns the fields { name = {value, off, len, field_off, field_len} or a
-- list of those for repeated ones } (offsets 0-based from s[1] + base), and whether the bytes are exactly what
-- protobuf's serializer writes (fields in number order, minimal varints, nothing unknown: ps-lite's
-- PackMeta output re-encodes to itself); nil + reason when the bytes are no such protobuf.
local function pb_parse(s, i, e, name, base)
    local schema = PB_SCHEMA[name]
    local out, canonical, last_number = {}, true, 0
    while i <= e do
        local field_start = i
        local key, khi, ni, kmin = varint(s, i, e)
        if key == nil or khi ~= 0 then return nil, "bad field key" end
        canonical = canonical and kmin
        i = ni
        local number, wire = floor(key / 8), key % 8
        local spec = schema[number]
        if number == 0 then return nil, "field number 0" end
        if number < last_number or (number == last_number and not (spec and spec.repeated)) then
            canonical = false
        end
        last_number = number
        local value, vstart, vlen
        if wire == 0 then
            local lo, hi, nj, minimal = varint(s, i, e)
            if lo == nil then return nil, "truncated varint" end
            canonical = canonical and minimal
            vstart, vlen, i = i, nj - i, nj
            if spec then
                local kind = spec[2]
                if kind == "int32" then
                    value = lo >= 2147483648 and lo - TWO32 or lo
                elseif kind == "bool" then
                    value = lo ~= 0 or hi ~= 0
                    canonical = canonical and hi == 0 and lo <= 1
                elseif kind == "uint64" then
                    value = UInt64(lo, hi)
                else
                    return nil, "varint for a length-delimited field"
                end
                if spec.packed then canonical = false end   -- the serializer writes data_type packed
            end
        elseif wire == 2 then
            local n, nhi, nj, minimal = varint(s, i, e)
            if n == nil or nhi ~= 0 or nj + n - 1 > e then return nil, "bad length" end
            canonical = canonical and minimal
            vstart, vlen, i = nj, n, nj + n
            if spec then
                local kind = spec[2]
                if kind == "bytes" then
                    value = ssub(s, vstart, vstart + n - 1)
                elseif PB_SCHEMA[kind] then
                    local sub, why, sub_canonical = pb_parse(s, vstart, vstart + n - 1, kind, base)
                    if sub == nil then return nil, why end
                    canonical = canonical and sub_canonical
                    value = sub
                elseif spec.packed then
                    value = {}
                    local j, pe = vstart, vstart + n - 1
                    while j <= pe do
                        local lo, _, nj2, min2 = varint(s, j, pe)
                        if lo == nil then return nil, "bad packed varint" end
                        canonical = canonical and min2
                        value[#value + 1] = { value = lo >= 2147483648 and lo - TWO32 or lo,
                                              off = base + j - 1, len = nj2 - j }
                        j = nj2
                    end
                    if n == 0 then canonical = false end
                else
                    return nil, "length-delimited data for a varint field"
                end
            end
        elseif wire == 1 then
            if i + 7 > e then return nil, "truncated fixed64" end
            if spec then return nil, "fixed64 for a known field" end
            vstart, vlen, i = i, 8, i + 8
        elseif wire == 5 then
            if i + 3 > e then return nil, "truncated fixed32" end
            if spec then return nil, "fixed32 for a known field" end
            vstart, vlen, i = i, 4, i + 4
        else
            return nil, "group or invalid wire type"
        end
        if spec == nil then
            canonical = false                               -- an unknown field: kept by protobuf, not shown
        else
            local fname = spec[1]
            local item = { value = value, off = base + vstart - 1, len = vlen,
                           field_off = base + field_start - 1, field_len = i - field_start }
            if spec.packed and wire == 2 then
                local list = out[fname] or {}
                for _, v in ipairs(value) do list[#list + 1] = v end
                out[fname] = list
            elseif spec.packed or spec.repeated then
                local list = out[fname] or {}
                list[#list + 1] = item
                out[fname] = list
            else
                out[fname] = item                           -- proto2: the last one wins
            end
        end
    end
    for _, spec in pairs(schema) do
        if spec.required and out[spec[1]] == nil then return nil, "required field " .. spec[1] .. " missing" end
    end
    return out, nil, canonical
end

local function opt(item) if item then return unset(item.value) end return nil end

-- A dmlc/ps-lite meta frame (bytes s) -> the meta table; strict: only as ps-lite's PackMeta writes one
-- (pslite.py _is_pslite_shaped). base: where s starts in the data source it is shown from.
local function dmlc_meta(s, strict, base)
    local pb, why, canonical = pb_parse(s, 1, #s, "PBMeta", base or 0)
    if pb == nil then return nil, why end
    if strict and not (canonical and pb.head and pb.request and pb.push and pb.simple_app) then
        return nil, "not shaped as ps-lite's PackMeta writes a meta"
    end
    local control = pb.control and pb.control.value
    local meta = { flavor = "dmlc", pb = pb, head = opt(pb.head),
                   request = pb.request and pb.request.value or false, push = pb.push and pb.push.value or false,
                   pull = pb.pull and pb.pull.value or false, simple_app = pb.simple_app and pb.simple_app.value or false,
                   timestamp = opt(pb.timestamp), app_id = opt(pb.app_id), customer_id = opt(pb.customer_id),
                   data_types = {}, nodes = {} }
    for _, t in ipairs(pb.data_type or {}) do meta.data_types[#meta.data_types + 1] = t.value end
    if control then
        local cmd = control.cmd.value
        meta.control_cmd = cmd ~= 0 and cmd or nil
        meta.barrier_group = opt(control.barrier_group)
        for _, n in ipairs(control.node or {}) do
            local node = n.value
            meta.nodes[#meta.nodes + 1] = {
                role = node.role.value, id = opt(node.id), hostname = node.hostname and node.hostname.value or "",
                port = opt(node.port), item = n, pb = node }
        end
    end
    return meta
end

-- bytedance/ps-lite: RawMeta | body | int32 data_type[] | RawNode[] (little-endian, x86-64). Layouts
-- (src/meta.h), newest first: { RawMeta bytes, RawNode bytes, has device fields, has sid }, told apart by
-- sizeof(RawMeta) + body + 4 * data_type_size + node_size * sizeof(RawNode) == the frame size.
local BYTEPS_LAYOUTS = { { 112, 552, true, true }, { 104, 552, true, false }, { 88, 168, false, false },
                         { 88, 84, false, false } }

local function byteps_meta(s)
    local len = #s
    local layout
    for _, l in ipairs(BYTEPS_LAYOUTS) do
        if len >= l[1] then
            local body_size, node_size, dts = i32le(s, 5), i32le(s, 13), i32le(s, 45)
            if body_size >= 0 and node_size >= 0 and dts >= 0
                    and l[1] + body_size + 4 * dts + node_size * l[2] == len then
                layout = l
                break
            end
        end
    end
    if layout == nil then return nil, "matches no RawMeta layout" end
    local body_size, node_size, dts = i32le(s, 5), i32le(s, 13), i32le(s, 45)
    local tail = layout[3] and 65 or 49            -- 1-based index of customer_id
    local request, push, simple_app = sbyte(s, 33), sbyte(s, tail + 4), sbyte(s, tail + 5)
    if request > 1 or push > 1 or simple_app > 1 then return nil, "RawMeta bools other than 0/1" end
    local cmd = i32le(s, 9)
    if cmd < 0 or cmd > 9 then return nil, "RawMeta control cmd out of range" end
    local control = cmd ~= 0
    local meta = { flavor = "byteps", layout = layout, raw = s, head = unset(i32le(s, 1)),
                   control_cmd = control and cmd or nil, request = request == 1, push = push == 1,
                   simple_app = simple_app == 1, pull = not (control or simple_app == 1 or push == 1),
                   app_id = unset(i32le(s, 37)), timestamp = unset(i32le(s, 41)),
                   customer_id = unset(i32le(s, tail)), data_types = {}, nodes = {} }
    -- PackMeta copies barrier_group only for BARRIER/INSTANCE_BARRIER, msg_sig only for ACK
    if cmd == BARRIER or cmd == INSTANCE_BARRIER then meta.barrier_group = i32le(s, 17) end
    if cmd == ACK then meta.msg_sig = u64le(s, 25) end
    local pos = layout[1] + 1
    meta.body_at = { pos - 1, body_size }
    pos = pos + body_size
    meta.data_types_at = pos - 1
    for k = 0, dts - 1 do meta.data_types[k + 1] = i32le(s, pos + 4 * k) end
    pos = pos + 4 * dts
    for k = 0, node_size - 1 do
        local p = pos + k * layout[2]
        local role, port, is_recovery
        if layout[2] == 552 then
            port, is_recovery = i32le(s, p + 204), sbyte(s, p + 464)
        else
            port, is_recovery = i32le(s, p + 72), sbyte(s, p + 76)
        end
        role = i32le(s, p)
        if role < 0 or role > 3 or is_recovery > 1 then return nil, "RawNode role / is_recovery out of range" end
        meta.nodes[#meta.nodes + 1] = { role = role, id = unset(i32le(s, p + 4)),
                                        hostname = ssub(s, p + 8, p + 71):match("^[^%z]*"), port = unset(port),
                                        raw_at = p - 1 }
    end
    return meta
end

-- Either flavor, a dmlc meta only when shaped as ps-lite writes it: how a stream's flavor is first decided.
local function strict_meta(s)
    local meta = dmlc_meta(s, true)
    if meta then return meta end
    return byteps_meta(s)
end

-- Can this frame body open a ps-lite message? A meta of either flavor or a bytedance routing frame: the
-- ZMTP decoder's resynchronisation validator (pslite.py looks_like_meta).
local function looks_like_meta(body)
    if #body <= MAX_ROUTING_FRAME_BYTES and parse_identity(body) then return true end
    return strict_meta(body) ~= nil
end

-- ---------------------------------------------------------------------------------------------------
-- ZMTP, one direction (decoders/protocols/zmtp.py): bytes and gaps in, events out
-- ---------------------------------------------------------------------------------------------------

-- Undecoded input in stream order: captured chunks { data, size, frame } and gaps { false, size, frame, lost }
-- (frame: the packet that carried the bytes, or that showed them missing).
local Queue = {}
Queue.__index = Queue

local function new_queue()
    return setmetatable({ items = {}, first = 1, last = 0, pos = 0, gaps = 0, offset = 0, last_frame = 0,
                          ended = false, buffered = 0 }, Queue)
end

function Queue:push(data, frame)
    self.last = self.last + 1
    self.items[self.last] = { data, #data, frame }
    self.buffered = self.buffered + #data
end

function Queue:push_gap(size, frame, lost)
    self.last = self.last + 1
    self.items[self.last] = { false, size, frame, lost }
    self.gaps = self.gaps + 1
end

function Queue:pop()
    self.items[self.first] = nil
    self.first = self.first + 1
    self.pos = 0
end

function Queue:queued() return self.first <= self.last end
function Queue:gap_lost() return self.items[self.first][4] end
function Queue:head_frame() return self:queued() and self.items[self.first][3] or self.last_frame end

-- What stops the captured bytes available now: "gap", "end", or nil (the lack of data).
function Queue:barrier()
    if self.gaps > 0 then return "gap" end
    return self.ended and "end" or nil
end

function Queue:contiguous_at_least(n)
    if self.gaps == 0 then return self.buffered >= n end
    local have = -self.pos
    for k = self.first, self.last do
        local item = self.items[k]
        if not item[1] then return false end
        have = have + item[2]
        if have >= n then return true end
    end
    return false
end

-- Up to n bytes from the current position (fewer at a gap or when no more are buffered).
function Queue:peek(n)
    local parts, pos = {}, self.pos
    for k = self.first, self.last do
        local item = self.items[k]
        if not item[1] or n <= 0 then break end
        local take = min(item[2] - pos, n)
        parts[#parts + 1] = ssub(item[1], pos + 1, pos + take)
        n = n - take
        pos = 0
    end
    return concat(parts)
end

-- Consume up to n captured bytes (stopping at a gap), appending them to pieces if given.
function Queue:read(n, pieces)
    local done = 0
    while done < n and self.first <= self.last do
        local item = self.items[self.first]
        if not item[1] then break end
        local avail = item[2] - self.pos
        local take = avail <= n - done and avail or n - done
        if pieces then pieces[#pieces + 1] = ssub(item[1], self.pos + 1, self.pos + take) end
        done = done + take
        self.last_frame = item[3]
        if take == avail then self:pop() else self.pos = self.pos + take end
    end
    self.offset = self.offset + done
    self.buffered = self.buffered - done
    return done
end

-- Consume up to n bytes (nil: all) of the gap at the current position.
function Queue:read_gap(n)
    local item = self.items[self.first]
    local take = n and min(n, item[2]) or item[2]
    item[2] = item[2] - take
    if item[2] == 0 then
        self:pop()
        self.gaps = self.gaps - 1
    end
    self.offset = self.offset + take
    self.last_frame = item[3]
    return take
end

function Queue:drop_all()
    local dropped = 0
    for k = self.first, self.last do dropped = dropped + self.items[k][2] end
    dropped = dropped - self.pos
    self.offset = self.offset + dropped
    self.items, self.first, self.last, self.pos, self.gaps, self.buffered = {}, 1, 0, 0, 0, 0
    return dropped
end

-- What follows the first bytes (libzmq's receive side): framing "1", "2" or "3" and the greeting size,
-- or nil until the bytes decide (zmtp.py _classify_greeting).
local function classify_greeting(head)
    local n = #head
    if n == 0 then return nil end
    if sbyte(head, 1) ~= 0xFF then return "1", 0 end
    if n < SIGNATURE_BYTES then return nil end
    if band(sbyte(head, 10), 1) == 0 then return "1", 0 end
    if n < 13 then return nil end
    local revision, identity_flags = sbyte(head, 11), sbyte(head, 13)
    if revision == 0 then return "1", GREETING_V2_BYTES end
    if (revision == 1 or revision == 3) and identity_flags == 0 then return "2", GREETING_V2_BYTES end
    if revision == 1 or not ssub(head, 13, 32):match("^[A-Z0-9_-]+%z*$") then return "1", 0 end
    if n < GREETING_V3_BYTES then return nil end
    return "3", GREETING_V3_BYTES
end

-- ZMTP metadata: (name_size u8, name, value_size u32 BE, value)*, as far as it is whole.
local function parse_metadata(body, pos)
    local names, values = {}, {}
    local stop = #body
    while pos <= stop do
        local name_end = pos + sbyte(body, pos)
        if name_end + 4 > stop then break end
        local value_size = u32be(body, name_end + 1)
        local value_start = name_end + 5
        if value_start + value_size - 1 > stop then break end
        names[#names + 1] = ssub(body, pos + 1, name_end)
        values[#values + 1] = ssub(body, value_start, value_start + value_size - 1)
        pos = value_start + value_size
    end
    return names, values
end

-- Is there a believable frame boundary at position i of window w (2.0/3.x framing)? zmtp.py _ZmtpScanner:
-- flags without reserved bits; LONG only above 255 bytes (as libzmq writes it) and at most 2^32; a command
-- (every frame of an encrypted stream) with a known name; a data frame that opens a message only if the
-- validator (a ps-lite meta or routing frame) accepts its body; up to 4 plausible headers in a row, fewer
-- only for a first frame unlikely by chance. Returns true, false, or the bytes needed from i.
local function plausible_header(w, j, reserved, named)
    local n = #w
    if j > n then return 1 end
    local flags = sbyte(w, j)
    if band(flags, reserved) ~= 0 then return false end
    local size, header_size
    if band(flags, FLAG_LONG) ~= 0 then
        if j + 8 > n then return 9 end
        size = u32be(w, j + 1) * TWO32 + u32be(w, j + 5)
        if not (size > 255 and size <= RESYNC_MAX_FRAME_BYTES) then return false end
        header_size = 9
    else
        if j + 1 > n then return 2 end
        size, header_size = sbyte(w, j + 1), 2
    end
    if band(flags, FLAG_COMMAND) ~= 0 or named then
        local body = j + header_size
        if size < 2 then return false end
        if body > n then return header_size + 1 end
        local name_size = sbyte(w, body)
        if name_size == 0 or name_size >= size then return false end
        if body + name_size > n then return header_size + 1 + name_size end
        if not KNOWN_COMMANDS[ssub(w, body + 1, body + name_size)] then return false end
        return header_size, size, false
    end
    if size == 0 and band(flags, FLAG_MORE) == 0 then return false end   -- what runs of zero bytes look like
    return header_size, size, true
end

local function judge(scanner, w, i, final)
    local reach = i + RESYNC_WINDOW_BYTES
    local j, strong = i, false
    for checked = 0, RESYNC_CHAIN_FRAMES - 1 do
        local header_size, size, is_data = plausible_header(w, j, scanner.reserved, scanner.named)
        if header_size == false then return false end
        if size == nil then                          -- the header is not all there: header_size bytes needed
            if final or j + header_size > reach then return checked >= 2 or strong end
            return j + header_size - i
        end
        if checked == 0 then
            strong = header_size == 9 or not is_data
            if is_data and scanner.validator then
                local stop = j + header_size + min(size, VALIDATOR_PREFIX_BYTES)
                if stop - 1 > #w then
                    if final then return false end
                    return stop - i
                end
                if not scanner.validator(ssub(w, j + header_size, stop - 1)) then return false end
                strong = true
            end
        end
        j = j + header_size + size
    end
    return true
end

-- (found, position, bytes needed from position); bytes before position are rejected (0-based position).
local function scan(scanner, w, final)
    local init = 1
    while true do
        local i = sfind(w, "[%z\1-\7]", init)
        if i == nil then break end
        if sbyte(w, i) ~= 0 or (i < #w and sbyte(w, i + 1) ~= 0) then
            local verdict = judge(scanner, w, i, final)
            if verdict == true then return true, i - 1, 0 end
            if verdict then return false, i - 1, verdict end
        end
        init = i + 1
    end
    local keep = (not final and #w > 0 and sbyte(w, #w) == 0) and 1 or 0
    return false, #w - keep, keep == 1 and 2 or 0
end

local Zmtp = {}
Zmtp.__index = Zmtp

-- keep_body(frame_index, size): which data frame bodies to keep; validator(body): what a resynchronised
-- data frame must be; midstream: the capture did not see the stream start (no greeting: 3.x framing assumed).
local function new_zmtp(keep_body, validator, midstream)
    return setmetatable({
        keep_body = keep_body, validator = validator, queue = new_queue(), events = {},
        state = midstream and "midstream" or "greeting", framing = "3", expect_identity = false,
        msg_sizes = {}, msg_flags = {}, msg_bodies = {}, msg_first_frame = 0, msg_complete = true,
        trust_next = true, frame_offset = 0, frame_kind = "data", frame_flags = 0, frame_size = 0,
        frame_first_frame = 0, frame_remaining = 0, frame_collect = 0, frame_pieces = nil, frame_complete = true,
        lost_from = 0, resync_reason = "", resync_need = 0,
        version = nil, mechanism = nil, as_server = nil, socket_type = nil, identity = nil, encrypted = false,
        messages = 0, commands = 0, lost_bytes = 0, resyncs = 0,
    }, Zmtp)
end

function Zmtp:receive_data(data, frame)
    if self.state == "failed" or self.queue.ended then
        self.lost_bytes = self.lost_bytes + #data
        return
    end
    self.queue:push(data, frame)
end

function Zmtp:receive_end()
    if self.state == "failed" or self.queue.ended then return end
    self.queue.ended = true
end

function Zmtp:receive_gap(size, frame, lost)
    if size <= 0 then return end
    if self.state == "failed" or self.queue.ended then
        self.lost_bytes = self.lost_bytes + size
        return
    end
    self.queue:push_gap(size, frame, lost)
end

-- How many of the next bytes may be counted unseen: the rest of a body not kept, but its last byte.
function Zmtp:skippable()
    if self.state == "failed" or self.queue.ended then return math.huge end
    if self.state == "body" and self.frame_collect == 0 and not self.queue:queued() then
        return max(self.frame_remaining - 1, 0)
    end
    return 0
end

function Zmtp:skip(size, frame)
    if self.state == "failed" or self.queue.ended then
        self.lost_bytes = self.lost_bytes + size
        return
    end
    self.queue.offset = self.queue.offset + size
    self.queue.last_frame = frame
    self.frame_remaining = self.frame_remaining - size
end

function Zmtp:emit(event)
    self.events[#self.events + 1] = event
end

-- The next event, or nil when more input is needed. One at a time: what the caller does with a message
-- (the ps-lite flavor it learns) decides which bodies of the next one are kept.
function Zmtp:next_event()
    local events = self.events
    while #events == 0 do
        local result = self["step_" .. self.state](self)
        if result == "need" then return nil end
        if result then self:lose_sync(result, self.frame_offset) end
    end
    return table.remove(events, 1)
end

function Zmtp:step_midstream()
    -- a capture may start mid-connection yet right at the greeting: 0xFF is no frame header's flags
    local q = self.queue
    local head = q:peek(SIGNATURE_BYTES)
    if #head < SIGNATURE_BYTES and q:barrier() == nil then return "need" end
    if #head == SIGNATURE_BYTES and sbyte(head, 1) == 0xFF and sbyte(head, 10) == 0x7F then
        self.state = "greeting"
    else
        self:start_resync("capture started mid-stream", q.offset)
    end
end

function Zmtp:step_greeting()
    local q = self.queue
    local head = q:peek(GREETING_V3_BYTES)
    local framing, size = classify_greeting(head)
    if framing == nil then
        local barrier = q:barrier()
        if barrier == nil then return "need" end
        if barrier == "gap" then
            self:start_resync("gap in the greeting", q.offset)
            return
        end
        self.lost_bytes = self.lost_bytes + q:read(#head)
        self.state = "done"
        return
    end
    local first = q:head_frame()
    q:read(size)
    self.framing = framing
    if framing == "3" then
        self.version = sbyte(head, 12) == 0 and "3.0" or "3.1"     -- libzmq reads any minor >= 1 as 3.1
        self.mechanism = ssub(head, 13, 32):match("^[^%z]*")
        self.as_server = sbyte(head, 33) ~= 0
        self.encrypted = ENCRYPTING[self.mechanism] == true
    else
        self.version = framing == "2" and "2.0" or "1.0"
        self.mechanism = "NULL"
        self.as_server = false
        self.expect_identity = true
        if size > 0 then
            local t = sbyte(head, 12)
            self.socket_type = SOCKET_TYPES[t] or tostring(t)
        end
    end
    self:emit({ kind = "greeting", version = self.version, mechanism = self.mechanism, as_server = self.as_server,
                socket_type = self.socket_type, last = size > 0 and q.last_frame or first })
    self.state = "header"
end

-- (flags, body size, header size), nil until the whole header is there, or false + why.
function Zmtp:parse_header(head)
    local n = #head
    if n == 0 then return nil end
    if self.framing == "1" then
        local length, flags, header_size
        if sbyte(head, 1) == 0xFF then
            if n < 10 then return nil end
            length, flags, header_size = u32be(head, 2) * TWO32 + u32be(head, 6), sbyte(head, 10), 10
        else
            if n < 2 then return nil end
            length, flags, header_size = sbyte(head, 1), sbyte(head, 2), 2
        end
        if length == 0 then return false, "ZMTP 1.0 frame of length 0 (it must count its flags byte)" end
        -- libzmq's own identity frame to an unversioned peer has flags 0x7F: only MORE matters there
        if band(flags, 0xFE) ~= 0 and not self.expect_identity then
            return false, sformat("reserved flag bits set in ZMTP 1.0 flags 0x%02x", flags)
        end
        return flags, length - 1, header_size
    end
    local flags = sbyte(head, 1)
    local reserved = self.framing == "3" and V3_RESERVED or V2_RESERVED
    if band(flags, reserved) ~= 0 then return false, sformat("reserved flag bits set in frame flags 0x%02x", flags) end
    if band(flags, FLAG_LONG) ~= 0 then
        if n < 9 then return nil end
        return flags, u32be(head, 2) * TWO32 + u32be(head, 6), 9
    end
    if n < 2 then return nil end
    return flags, sbyte(head, 2), 2
end

function Zmtp:step_header()
    local q = self.queue
    self.frame_offset = q.offset
    local head = q:peek(HEADER_MAX_BYTES)
    local flags, size, header_size = self:parse_header(head)
    if flags == false then return size end
    if flags == nil then
        local barrier = q:barrier()
        if barrier == nil then return "need" end
        if barrier == "gap" then
            self:lose_sync("gap in a frame header", q.offset)
            return
        end
        self.lost_bytes = self.lost_bytes + q:read(#head)      -- a header cut off by the end of the stream
        self:flush_message(false)
        self.state = "done"
        return
    end
    local first = q:head_frame()
    q:read(header_size)
    self.frame_flags, self.frame_size, self.frame_remaining = flags, size, size
    self.frame_first_frame = first
    self.frame_complete = true
    local kind, collect
    if self.expect_identity then
        kind, collect = "identity", min(size, COMMAND_BODY_CAP_BYTES)
    elseif self.encrypted then
        kind, collect = "command", min(size, ENCRYPTED_NAME_PREFIX_BYTES)
    elseif band(flags, FLAG_COMMAND) ~= 0 then
        kind, collect = "command", min(size, COMMAND_BODY_CAP_BYTES)
    else
        kind = "data"
        if #self.msg_sizes == 0 then
            self.msg_first_frame = first
            self.msg_complete = self.trust_next
            self.trust_next = true
        end
        collect = self.keep_body(#self.msg_sizes, size) and size or -1
    end
    self.frame_kind = kind
    self.frame_collect = max(collect, 0)
    self.frame_pieces = collect >= 0 and {} or nil
    self.state = "body"
end

function Zmtp:step_body()
    local q = self.queue
    while self.frame_remaining > 0 do
        local n
        if self.frame_collect > 0 then
            n = q:read(min(self.frame_remaining, self.frame_collect), self.frame_pieces)
            self.frame_collect = self.frame_collect - n
        else
            n = q:read(self.frame_remaining)
        end
        if n > 0 then
            self.frame_remaining = self.frame_remaining - n
        else
            local barrier = q:barrier()
            if barrier == nil then return "need" end
            if barrier == "gap" and self.frame_collect == 0 and not q:gap_lost() then
                -- value bytes the capture cut on purpose (snaplen), in a body not kept: nothing is lost
                self.frame_remaining = self.frame_remaining - q:read_gap(self.frame_remaining)
            else
                -- lost or missing body bytes: the frame's end is still known, its body is not whole
                self.frame_complete = false
                self.frame_collect = 0
                if barrier == "gap" then
                    self.frame_remaining = self.frame_remaining - q:read_gap(self.frame_remaining)
                else
                    self.frame_remaining = 0
                end
            end
        end
    end
    return self:finish_frame()
end

function Zmtp:finish_frame()
    self.state = "header"
    local body = self.frame_pieces and concat(self.frame_pieces) or nil
    local kind = self.frame_kind
    if kind == "data" then
        local k = #self.msg_sizes + 1
        self.msg_sizes[k] = self.frame_size
        self.msg_flags[k] = self.frame_flags
        self.msg_bodies[k] = self.frame_complete and body or false
        self.msg_complete = self.msg_complete and self.frame_complete
        if band(self.frame_flags, FLAG_MORE) == 0 then self:flush_message(self.msg_complete) end
    elseif kind == "command" then
        return self:emit_command(body or "")
    else
        self.expect_identity = false
        self.identity = (body and self.frame_complete) and body or nil
    end
end

-- Emit the message being assembled, if any (complete false: its end was never seen).
function Zmtp:flush_message(complete)
    if #self.msg_sizes == 0 then return end
    self:emit({ kind = "message", sizes = self.msg_sizes, flags = self.msg_flags, bodies = self.msg_bodies,
                complete = complete, first = self.msg_first_frame, last = self.queue.last_frame })
    self.messages = self.messages + 1
    self.msg_sizes, self.msg_flags, self.msg_bodies = {}, {}, {}
end

function Zmtp:emit_command(body)
    local complete = self.frame_complete
    local name_size = #body > 0 and sbyte(body, 1) or 0
    local name = ssub(body, 2, 1 + name_size)
    if name_size == 0 or #name < name_size or not name:match("^[A-Za-z]+$") then
        if complete then return "malformed command name" end
        name = ""
    end
    if self.encrypted and complete and not KNOWN_COMMANDS[name] then
        return sformat("unexpected command %q on an encrypted stream", name)
    end
    local event = { kind = "command", name = name, size = self.frame_size, flags = self.frame_flags,
                    complete = complete, first = self.frame_first_frame, last = self.queue.last_frame }
    if complete and #body == self.frame_size and not self.encrypted then
        if METADATA_COMMANDS[name] then
            event.names, event.values = parse_metadata(body, 2 + name_size)
            for k, prop in ipairs(event.names) do
                local lower = prop:lower()        -- ZMTP property names are case-insensitive
                if lower == "socket-type" then self.socket_type = event.values[k] end
                if lower == "identity" then self.identity = event.values[k] end
            end
        elseif name == "HELLO" and self.mechanism == "PLAIN" then
            -- PLAIN HELLO: username_size u8, username, password_size u8, password (never shown)
            local at = 2 + name_size
            if at <= #body and at + sbyte(body, at) <= #body then
                event.username = ssub(body, at + 1, at + sbyte(body, at))
            end
        end
        event.body = body
    end
    self.commands = self.commands + 1
    self:emit(event)
end

-- Framing is lost from from_offset (the last frame boundary known) on.
function Zmtp:lose_sync(reason, from_offset)
    self:flush_message(false)
    if self.framing == "1" then
        self:emit({ kind = "failed", reason = reason .. " (ZMTP 1.0 streams are not resynchronised)",
                    last = self.queue.last_frame })
        self.lost_bytes = self.lost_bytes + self.queue.offset - from_offset + self.queue:drop_all()
        self.state = "failed"
    else
        self:start_resync(reason, from_offset)
    end
end

function Zmtp:start_resync(reason, from_offset)
    self.state = "resync"
    self.lost_from = from_offset
    self.resync_reason = reason
    self.resync_need = 0
    self.expect_identity = false
end

function Zmtp:step_resync()
    local q = self.queue
    local scanner = { reserved = self.framing == "3" and V3_RESERVED or V2_RESERVED, named = self.encrypted,
                      validator = self.validator }
    while true do
        local need = self.resync_need
        if need > 0 and not q:contiguous_at_least(need) and q:barrier() == nil then return "need" end
        local window = q:peek(RESYNC_WINDOW_BYTES)
        local capped = #window == RESYNC_WINDOW_BYTES
        local barrier = not capped and q:barrier() or nil
        local found, position
        found, position, self.resync_need = scan(scanner, window, barrier ~= nil)
        q:read(position)
        if found then
            local lost = q.offset - self.lost_from
            self.lost_bytes = self.lost_bytes + lost
            self.resyncs = self.resyncs + 1
            self:emit({ kind = "resync", lost = lost, reason = self.resync_reason, last = q:head_frame() })
            self.trust_next = self.validator ~= nil
            self.state = "header"
            return
        end
        if not (self.resync_need > 0 or capped) then
            if barrier == "gap" then
                q:read_gap()
            elseif barrier == "end" then
                self.lost_bytes = self.lost_bytes + q.offset - self.lost_from
                self.state = "done"
                return
            else
                return "need"
            end
        end
    end
end

function Zmtp:step_done() return "need" end
Zmtp.step_failed = Zmtp.step_done

-- ---------------------------------------------------------------------------------------------------
-- ps-lite on a ZMTP direction (pslite.py PsliteDecoder): one ZMTP message -> one ps-lite message
-- ---------------------------------------------------------------------------------------------------

-- The frame's little-endian items, or nil when its body was not captured; false + why when it is no whole
-- number of items.
local function items_of(body, size, item_bytes, what)
    if not body or #body ~= size then return nil end
    if size % item_bytes ~= 0 then
        return false, sformat("%s frame of %d bytes is not a whole number of %d-byte items", what, size, item_bytes)
    end
    local out = {}
    for k = 0, size / item_bytes - 1 do
        out[k + 1] = item_bytes == 8 and u64le(body, 1 + 8 * k) or i32le(body, 1 + 4 * k)
    end
    return out
end

-- The sizes of all the data frames the meta announces, for a message a capture hole cut short: those seen,
-- then what the message itself states (false where it states nothing): one int32 len per key, and
-- sum(lens) items of the values' data type.
local function stated_sizes(types, seen, keys, lens)
    local sizes = {}
    for k = 1, #types do sizes[k] = seen[k] or false end
    if #sizes >= 3 and not sizes[3] and types[3] == DATA_TYPE_INT32 and keys then sizes[3] = 4 * #keys end
    local item_bytes = #types >= 2 and DATA_TYPE_ITEM_BYTES[types[2]] or nil
    if #sizes >= 2 and not sizes[2] and lens and item_bytes then
        local total = 0
        for _, v in ipairs(lens) do total = total + v end
        sizes[2] = total * item_bytes
    end
    return sizes
end

-- Which frame bodies to keep (pslite.py keep_body): the routing frame, the meta, the keys and the lens;
-- never the values; nothing above 64 KiB past a message's first two frames.
local function pslite_keep_body(ps, frame_index, size)
    if frame_index == 0 then
        ps.first_frame_size = size
        return true
    end
    if frame_index >= KEPT_FIRST_FRAMES and size > KEPT_BODY_BYTES then return false end
    local routed = ps.routed
    if routed == nil then routed = ps.flavor ~= "dmlc" and ps.first_frame_size <= MAX_ROUTING_FRAME_BYTES end
    return frame_index - (routed and 2 or 1) ~= 1
end

-- One ZMTP message (frame sizes, kept bodies or false) -> the ps-lite message, or nil + why.
local function decode_pslite(ps, sizes, bodies, complete)
    local routing
    if ps.flavor ~= "dmlc" and #sizes > 1 and sizes[1] <= MAX_ROUTING_FRAME_BYTES and bodies[1]
            and parse_identity(bodies[1]) then
        routing = bodies[1]
    end
    local mi = routing and 2 or 1
    local meta_frame = bodies[mi]
    if not meta_frame or #meta_frame ~= sizes[mi] then
        return nil, sformat("the meta frame (%d bytes) was not captured whole", sizes[mi])
    end
    local meta, why
    if ps.flavor == "dmlc" then
        meta, why = dmlc_meta(meta_frame, false)
    elseif ps.flavor == "byteps" or routing then
        meta, why = byteps_meta(meta_frame)
    else
        meta, why = strict_meta(meta_frame)
    end
    if meta == nil then return nil, why end
    local data_sizes, types = {}, meta.data_types
    for k = mi + 1, #sizes do data_sizes[#data_sizes + 1] = sizes[k] end
    if #types ~= #data_sizes and (complete or #data_sizes > #types) then
        return nil, sformat("the meta announces %d data frames, the message has %d", #types, #data_sizes)
    end
    local keys, lens
    if #data_sizes >= 1 and types[1] == DATA_TYPE_UINT64 then
        keys, why = items_of(bodies[mi + 1], data_sizes[1], 8, "keys")
        if keys == false then return nil, why end
    end
    if #data_sizes >= 3 and types[3] == DATA_TYPE_INT32 then
        lens, why = items_of(bodies[mi + 3], data_sizes[3], 4, "lens")
        if lens == false then return nil, why end
    end
    if keys and lens and #keys ~= #lens then return nil, sformat("%d keys but %d lens", #keys, #lens) end
    if #data_sizes < #types then data_sizes = stated_sizes(types, data_sizes, keys, lens) end
    ps.flavor = meta.flavor
    ps.routed = routing ~= nil
    local size = sizes[mi]
    for _, v in ipairs(data_sizes) do size = size + (v or 0) end
    return { meta = meta, routing = routing, meta_index = mi, data_sizes = data_sizes, keys = keys or {},
             lens = lens, size = size }
end

-- ---------------------------------------------------------------------------------------------------
-- Gloo, one direction (gloo.py GlooStreamDecoder)
-- ---------------------------------------------------------------------------------------------------

-- The 48-byte preamble at s[i..]: six u64 LE, nbytes opcode slot offset length roffset, as Gloo writes them;
-- nil + why otherwise (gloo.py parse_preamble).
local function gloo_preamble(s, i)
    if #s - i + 1 < GLOO_PREAMBLE_BYTES then return nil, "a preamble has 48 bytes" end
    if u32le(s, i + 12) ~= 0 or u32le(s, i + 8) > 3 then return nil, "not a Gloo opcode" end
    local opcode = u32le(s, i + 8)
    local nbytes, length = u64le_number(s, i), u64le_number(s, i + 32)
    if length >= GLOO_MAX_MESSAGE_BYTES then return nil, "length beyond any tensor" end
    if opcode <= 1 then
        if nbytes ~= GLOO_PREAMBLE_BYTES + length then return nil, "nbytes != 48 + length" end
    elseif nbytes ~= GLOO_PREAMBLE_BYTES then
        return nil, "a notification is 48 bytes"
    end
    if opcode ~= 0 and (u64le_number(s, i + 24) ~= 0 or u64le_number(s, i + 40) ~= 0) then
        return nil, "offset / roffset set outside SEND_BUFFER"
    end
    local prefix = sbyte(s, i + 23)
    if prefix > 8 or (prefix ~= 0 and (sbyte(s, i + 17) ~= 0 or sbyte(s, i + 18) ~= 0)) then
        return nil, "no Gloo collective slot"
    end
    return nbytes
end

local function gloo_scan(w, from)
    local init = from
    while true do
        local k = sfind(w, "[%z\1-\3]%z%z%z%z%z%z%z", init)    -- an opcode, 8 bytes into a preamble
        if k == nil then return nil end
        local c = k - 8
        if c >= 1 and c + GLOO_PREAMBLE_BYTES - 1 <= #w and gloo_preamble(w, c) then return c end
        init = k + 1
    end
end

local Gloo = {}
Gloo.__index = Gloo

local function new_gloo(initiator, midstream)
    local g = setmetatable({ offset = 0, lost_bytes = 0, resyncs = 0, messages = 0, header = "", scan_tail = "",
                             unsynced = 0, unsynced_reason = "", remaining = 0, missing = 0, message_first = 0,
                             state = initiator and "sequence" or "preamble", events = {} }, Gloo)
    if midstream then g:lose_sync("capture started mid-connection", 0) end
    return g
end

function Gloo:emit(event) self.events[#self.events + 1] = event end

function Gloo:message_done(frame)
    self.state = "preamble"
    self.messages = self.messages + 1
    self:emit({ kind = "gloo", preamble = self.preamble, first = self.message_first, last = frame,
                missing = self.missing, complete = self.missing == 0 })
end

function Gloo:lose_sync(reason, lost, scan_from)
    if self.state ~= "resync" then self.unsynced_reason = reason end
    self.unsynced = self.unsynced + lost + #self.header + #self.scan_tail
    self.header = ""
    self.scan_tail = scan_from or ""
    self.state = "resync"
end

function Gloo:start_message(preamble, frame)
    local nbytes, why = gloo_preamble(preamble, 1)
    if nbytes == nil then
        self:lose_sync(why, 1, ssub(preamble, 2))    -- scan again from the byte after
        return
    end
    self.preamble = preamble
    self.remaining = nbytes - GLOO_PREAMBLE_BYTES
    self.missing = 0
    if self.remaining > 0 then self.state = "payload" else self:message_done(frame) end
end

function Gloo:skip(size, frame)                       -- payload bytes: counted, never read
    self.remaining = self.remaining - size
    self.offset = self.offset + size
    if self.remaining == 0 then self:message_done(frame) end
end

function Gloo:skippable() return self.state == "payload" and self.remaining or 0 end

function Gloo:receive_data(data, frame)
    local pos, stop = 1, #data
    while pos <= stop do
        local state = self.state
        if state == "payload" then
            local step = min(self.remaining, stop - pos + 1)
            self:skip(step, frame)
            pos = pos + step
        elseif state == "preamble" then
            if self.header == "" then
                self.message_first = frame
                if stop - pos + 1 >= GLOO_PREAMBLE_BYTES then    -- the common case: the whole preamble here
                    self.offset = self.offset + GLOO_PREAMBLE_BYTES
                    self:start_message(ssub(data, pos, pos + GLOO_PREAMBLE_BYTES - 1), frame)
                    pos = pos + GLOO_PREAMBLE_BYTES
                    goto continue
                end
            end
            local taken = min(GLOO_PREAMBLE_BYTES - #self.header, stop - pos + 1)
            self.header = self.header .. ssub(data, pos, pos + taken - 1)
            self.offset = self.offset + taken
            pos = pos + taken
            if #self.header == GLOO_PREAMBLE_BYTES then
                local header = self.header
                self.header = ""
                self:start_message(header, frame)
            end
        elseif state == "sequence" then
            local taken = min(GLOO_SEQUENCE_BYTES - #self.header, stop - pos + 1)
            self.header = self.header .. ssub(data, pos, pos + taken - 1)
            self.offset = self.offset + taken
            pos = pos + taken
            if #self.header == GLOO_SEQUENCE_BYTES then
                local header = self.header
                self.header = ""
                local sequence = i64le_number(header, 1)
                if sequence >= 0 and sequence < GLOO_MAX_SEQUENCE then
                    self:emit({ kind = "gloo_connect", sequence = sequence, last = frame })
                    self.state = "preamble"
                else              -- not a connecting side after all: these bytes may begin a preamble
                    self:lose_sync(sformat("connect sequence number %d out of range", sequence), 0, header)
                end
            end
        else
            local tail = self.scan_tail
            local window = tail .. ssub(data, pos)
            local start = gloo_scan(window, 1)
            if start then
                local lost = self.unsynced + start - 1
                self.lost_bytes = self.lost_bytes + lost
                self.resyncs = self.resyncs + 1
                self:emit({ kind = "gloo_resync", lost = lost, reason = self.unsynced_reason, last = frame })
                self.unsynced, self.scan_tail, self.state, self.message_first = 0, "", "preamble", frame
                local consumed = start - 1 + GLOO_PREAMBLE_BYTES - #tail
                self.offset = self.offset + consumed
                self:start_message(ssub(window, start, start + GLOO_PREAMBLE_BYTES - 1), frame)
                pos = pos + consumed
            else
                local keep = min(#window, GLOO_PREAMBLE_BYTES - 1)
                self.unsynced = self.unsynced + #window - keep
                self.scan_tail = ssub(window, #window - keep + 1)
                self.offset = self.offset + stop - pos + 1
                pos = stop + 1
            end
        end
        ::continue::
    end
end

function Gloo:receive_gap(size, frame)
    self.offset = self.offset + size
    if self.state == "payload" then
        local covered = min(size, self.remaining)
        self.remaining = self.remaining - covered
        self.missing = self.missing + covered
        size = size - covered
        if self.remaining == 0 then self:message_done(frame) end
    end
    if size > 0 then self:lose_sync(sformat("%d bytes lost where a header was due", size), size) end
end

function Gloo:receive_end(frame)
    if self.state == "payload" then
        self.missing = self.missing + self.remaining
        self.remaining = 0
        self:message_done(frame)
        return
    end
    self.lost_bytes = self.lost_bytes + #self.header + #self.scan_tail + self.unsynced
    self.header, self.scan_tail, self.unsynced = "", "", 0
end

-- ---------------------------------------------------------------------------------------------------
-- State of one capture: the first pass fills it, every pass shows it
-- ---------------------------------------------------------------------------------------------------

-- A TCP direction ("stream", decoders/tcp.py TcpStream) is a table holding its reassembly state, what the
-- dispatch decided (owner "pslite", "gloo", "tcpstore", or none) and its decoder. Results are what a packet
-- shows: per frame number, the events that packet completed, in order.
local capture

local function reset_capture()
    capture = {
        streams = {},           -- in creation order
        by_key = {},            -- "src|port>dst|port" -> the latest stream on it
        store_clients = {},     -- key -> TCPStore client stream (its answers belong to it too)
        results = {},           -- frame number -> list of results
        frame = 0,              -- the packet being read (first pass)
        last_frame = 0,
        finished = false,       -- what was open at the end of the capture has ended
        resolved = 0,           -- ps-lite messages whose node ids and tensors are worked out
        -- ps-lite across the capture (pslite.py rows pslite_nodes, pslite_announced, pslite_routed)
        nodes = {},             -- node id -> { role, hostname, port } from ADD_NODE replies
        announced = {},         -- stream -> the nodes (host, port) its ADD_NODE request announced
        routed = {},            -- stream -> the node id its bytedance routing frames name
        control_requests = {},  -- stream -> true: it carried control requests
        messages = {},          -- every ps-lite message result, in order
    }
end
reset_capture()

local function add_result(result)
    local frame = capture.frame
    local list = capture.results[frame]
    if list == nil then
        list = {}
        capture.results[frame] = list
    end
    list[#list + 1] = result
end

-- ---------------------------------------------------------------------------------------------------
-- The decoders as owners of TCP directions (pslite.py PsliteCaptureDecoder, gloo.py GlooCaptureDecoder)
-- ---------------------------------------------------------------------------------------------------

local function zmtp_signature(prefix)            -- true / false / nil while unknown
    if #prefix == 0 then return nil end
    if sbyte(prefix, 1) ~= 0xFF then return false end
    if #prefix < 10 then return nil end
    return sbyte(prefix, 10) == 0x7F
end

-- ZMTP 1.0: a short identity frame `len flags` with flags 0, or 0xFF + 8-byte length (weak evidence)
local function looks_like_zmtp10(prefix)
    if #prefix >= 10 and sbyte(prefix, 1) == 0xFF then return band(sbyte(prefix, 10), 1) == 0 end
    return #prefix >= 2 and sbyte(prefix, 2) == 0 and #prefix >= sbyte(prefix, 1) + 1 and sbyte(prefix, 1) >= 1
end

local function start_pslite(s, midstream)
    local ps = { first_frame_size = 0 }     -- flavor, routed, is_pslite: nil until a message decides them
    ps.zmtp = new_zmtp(function(index, size) return pslite_keep_body(ps, index, size) end, looks_like_meta,
                       midstream)
    s.owner, s.ps = "pslite", ps
end

local function on_pslite_message(s, ps, event)
    if ps.is_pslite == false then return end
    local msg, why = decode_pslite(ps, event.sizes, event.bodies, event.complete)
    if msg == nil then
        if ps.is_pslite == nil and event.complete then ps.is_pslite = false else event.undecoded = why end
        return
    end
    ps.is_pslite = true
    event.ps = msg
    local meta = msg.meta
    if msg.routing and capture.routed[s] == nil then capture.routed[s] = parse_identity(msg.routing) end
    if meta.control_cmd and meta.request then capture.control_requests[s] = true end
    if meta.control_cmd == ADD_NODE then
        local assigned = not meta.request
        for _, n in ipairs(meta.nodes) do if n.id == nil then assigned = false end end
        for _, n in ipairs(meta.nodes) do
            if assigned then
                capture.nodes[n.id] = { role = n.role, hostname = n.hostname, port = n.port }
            else
                local list = capture.announced[s] or {}
                list[#list + 1] = n
                capture.announced[s] = list
            end
        end
    end
    capture.messages[#capture.messages + 1] = event
end

local function drain_pslite(s)
    local ps = s.ps
    while true do
        local event = ps.zmtp:next_event()
        if event == nil then return end
        event.stream = s
        if event.kind == "message" then on_pslite_message(s, ps, event) end
        add_result(event)
    end
end

local function drain_gloo(s)
    for _, event in ipairs(s.gloo.events) do
        event.stream = s
        add_result(event)
    end
    s.gloo.events = {}
end

-- The Gloo side of the dispatch (gloo.py claim): TCPStore connections by their first bytes (and their
-- answers), Gloo pairs by a preamble at the start, or the connecting side's sequence number and one, or,
-- for a connection caught mid-stream, a preamble within the first bytes. dlcsniff also knows the pairs'
-- listening addresses from the TCPStore rendezvous; this script does not read the rendezvous.
local function claim_gloo(s, prefix)
    if capture.store_clients[s.reverse_key] then
        s.owner = "tcpstore"
        return true
    end
    if s.syn_seen and ssub(prefix, 1, #TCPSTORE_VALIDATE) == ssub(TCPSTORE_VALIDATE, 1, #prefix) then
        if #prefix < #TCPSTORE_VALIDATE then return nil end
        s.owner = "tcpstore"
        capture.store_clients[s.key] = s
        return true
    end
    local role
    if #prefix >= GLOO_PREAMBLE_BYTES and gloo_preamble(prefix, 1) then
        role = s.syn_seen and "listener" or "unknown"
    elseif not s.syn_seen then
        for start = 1, #prefix - GLOO_PREAMBLE_BYTES + 1 do
            if gloo_preamble(prefix, start) then role = "unknown" break end
        end
        if role == nil then
            if #prefix < GLOO_SEQUENCE_BYTES + GLOO_PREAMBLE_BYTES then return nil end
            return false
        end
    elseif #prefix >= GLOO_SEQUENCE_BYTES + GLOO_PREAMBLE_BYTES then
        local sequence = i64le_number(prefix, 1)
        if not (sequence >= 0 and sequence < GLOO_MAX_SEQUENCE and gloo_preamble(prefix, 9)) then return false end
        role = "initiator"
    else
        if #prefix < 8 then return nil end
        local first = u64le_number(prefix, 1)
        if first < GLOO_MAX_SEQUENCE or (first >= GLOO_PREAMBLE_BYTES and first < GLOO_MAX_MESSAGE_BYTES) then
            return nil
        end
        return false
    end
    s.owner, s.gloo = "gloo", new_gloo(role == "initiator", role == "unknown")
    return true
end

-- ZMTP's side: a greeting signature from the connection's start; as a fallback once nobody claimed the
-- direction, ZMTP found by resynchronisation (its start not captured) or ZMTP 1.0 by its identity frame.
local function claim_pslite(s, prefix)
    local signature = zmtp_signature(prefix)
    if signature == nil then return nil end
    if signature and s.syn_seen then
        start_pslite(s, false)
        return true
    end
    return false
end

local function claim_fallback(s, prefix, seen_data)
    if not s.syn_seen or not seen_data then
        start_pslite(s, true)
        return true
    end
    if looks_like_zmtp10(prefix) then
        start_pslite(s, false)
        return true
    end
    return false
end

local CLAIMS = { { "pslite", claim_pslite }, { "gloo", claim_gloo } }

local function owner_data(s, data, frame)
    if s.owner == "pslite" then
        s.ps.zmtp:receive_data(data, frame)
        drain_pslite(s)
    elseif s.owner == "gloo" then
        s.gloo:receive_data(data, frame)
        drain_gloo(s)
    end
end

-- Decide who reads a direction (capture_decoder.py _decide): its first bytes are held while a decoder
-- wants to see more; the first to claim it gets it, held bytes first.
local function decide(s, final)
    local held = concat(s.held)
    local prefix = ssub(held, 1, PREFIX_BYTES)
    local winner, waiting = false, false
    for _, entry in ipairs(CLAIMS) do
        if not s.declined[entry[1]] then
            local verdict = entry[2](s, prefix)
            if verdict then
                winner = true
                break
            end
            if verdict == nil then waiting = true else s.declined[entry[1]] = true end
        end
    end
    if not winner then
        if waiting and not final and #prefix < PREFIX_BYTES then return end
        claim_fallback(s, prefix, #s.held > 0)
    end
    s.decided = true
    local chunks, frames = s.held, s.held_frames
    s.held, s.held_frames = {}, {}
    for k, chunk in ipairs(chunks) do owner_data(s, chunk, frames[k]) end
end

-- The stream events (decoders/tcp.py) as the capture decoder hands them on.
local function stream_data(s, src, off, size, frame)
    if s.owner then
        local decoder = s.owner == "pslite" and s.ps.zmtp or s.gloo
        if decoder == nil then return end                          -- tcpstore: not shown
        local skippable = decoder:skippable()
        if skippable >= size then
            decoder:skip(size, frame)
            if s.owner == "gloo" then drain_gloo(s) end
        else
            owner_data(s, bytes_of(src, off, size), frame)
        end
    elseif not s.decided then
        s.held[#s.held + 1] = bytes_of(src, off, size)
        s.held_frames[#s.held_frames + 1] = frame
        decide(s, false)
    end
end

local function stream_gap(s, size, frame, lost)
    if not s.decided then decide(s, true) end
    if s.owner == "pslite" then
        s.ps.zmtp:receive_gap(size, frame, lost)
        drain_pslite(s)
    elseif s.owner == "gloo" then
        s.gloo:receive_gap(size, frame)
        drain_gloo(s)
    end
end

local function stream_end(s, frame)
    if not s.decided then decide(s, true) end
    if s.owner == "pslite" then
        s.ps.zmtp:receive_end()
        drain_pslite(s)
    elseif s.owner == "gloo" then
        s.gloo:receive_end(frame)
        drain_gloo(s)
    end
end

-- Does the direction need its payload bytes? Not once it is decided and nobody decodes it.
local function wants_bytes(s)
    return not s.decided or s.owner == "pslite" or s.owner == "gloo"
end

-- ---------------------------------------------------------------------------------------------------
-- TCP reassembly, one direction at a time (decoders/tcp.py TcpReassembler)
-- ---------------------------------------------------------------------------------------------------

local SEQ_MODULUS, SEQ_HALF = TWO32, 2147483648
local MAX_BUFFERED_BYTES_PER_STREAM = 4 * 1048576
-- How long after an acknowledgement (capture time) a hole may still be filled by a reordered segment
local REORDER_WINDOW_US = 50000

local function offset_of(s, seq)
    local rel = (seq - s.next_seq) % SEQ_MODULUS
    return s.next_offset + (rel >= SEQ_HALF and rel - SEQ_MODULUS or rel)
end

local function start_stream(key, reverse_key, src, sport, dst, dport, ts, syn_seen, next_seq)
    local s = { key = key, reverse_key = reverse_key, src = src, sport = sport, dst = dst, dport = dport,
                syn_seen = syn_seen, isn = syn_seen and (next_seq - 1) % SEQ_MODULUS or nil,
                next_seq = next_seq, next_offset = 0, acked_offset = 0, acked_ts = 0, fin_offset = nil,
                fin_ts = 0, fin_frame = 0, ended = false, pending = {}, buffered = 0,
                last_ts = ts, last_frame = capture.frame,
                decided = false, held = {}, held_frames = {}, declined = {} }
    s.flow = sformat(sfind(src, ":", 1, true) and "[%s]:%d → [%s]:%d" or "%s:%d → %s:%d", src, sport, dst, dport)
    capture.streams[#capture.streams + 1] = s
    capture.by_key[key] = s
    return s
end

-- `size` wire bytes at the next offset, of which the first `captured` are src[off..] (the rest cut by the
-- snaplen: not lost).
local function deliver(s, src, off, captured, size, frame)
    if captured > 0 then stream_data(s, src, off, captured, frame) end
    if captured < size then stream_gap(s, size - captured, frame, false) end
    s.next_offset = s.next_offset + size
    s.next_seq = (s.next_seq + size) % SEQ_MODULUS
end

local function end_stream(s, frame)
    s.ended = true
    s.pending, s.buffered = {}, 0          -- anything buffered lies beyond the FIN: not stream bytes
    stream_end(s, frame)
end

local function check_fin(s)
    if s.fin_offset and s.next_offset >= s.fin_offset then end_stream(s, s.fin_frame) end
end

-- Deliver buffered pieces { start, stop, bytes / true (not kept) / false (never captured), frame } that
-- now continue the stream, then end it if that reached the FIN.
local function drain(s)
    local pending = s.pending
    while #pending > 0 and pending[1][1] == s.next_offset do
        local piece = table.remove(pending, 1)
        local start, stop, data, frame = piece[1], piece[2], piece[3], piece[4]
        if data == false then              -- the cut tail of a segment that came out of order
            stream_gap(s, stop - start, frame, false)
            s.next_offset = stop
            s.next_seq = (s.next_seq + stop - start) % SEQ_MODULUS
        else
            s.buffered = s.buffered - (stop - start)
            deliver(s, data == true and "" or data, 0, stop - start, stop - start, frame)
        end
    end
    check_fin(s)
end

-- Where the first hole ends: at the first buffered piece or the FIN, whichever comes first.
local function hole_end(s)
    local fin = s.fin_offset
    if #s.pending > 0 then
        local start = s.pending[1][1]
        if fin == nil or start < fin then return start end
        return fin
    end
    return fin
end

-- Declare the first hole lost (a gap shown by packet `frame`), and go on after it.
local function skip_hole(s, frame)
    local target = hole_end(s)
    local size = target - s.next_offset
    stream_gap(s, size, frame, true)
    s.next_offset = target
    s.next_seq = (s.next_seq + size) % SEQ_MODULUS
    drain(s)
end

-- Skip every hole that ends at or before `limit` (nil: all) and has buffered data or the FIN after it.
local function flush(s, limit, frame)
    while not s.ended do
        local target = hole_end(s)
        if target == nil or (limit and target > limit) then return end
        skip_hole(s, frame)
    end
end

-- Holes wholly before what the other side acknowledged will never be filled in this capture, once the
-- reorder window after that acknowledgement has passed.
local function resolve_acked(s, ts, frame)
    if not s.ended and s.acked_offset > s.next_offset and ts - s.acked_ts >= REORDER_WINDOW_US then
        flush(s, s.acked_offset, frame)
    end
end

-- No more segments will come for this stream: every hole is lost; end it unless a FIN ends it.
local function end_unseen(s, frame)
    flush(s, nil, frame)
    if not s.ended then end_stream(s, s.last_frame) end
end

-- Keep [start, stop) until the bytes before it arrive, minus what is already buffered.
local function buffer(s, start, stop, src, off, frame)
    local pending = s.pending
    local lo, hi = 1, #pending + 1                  -- bisect_right on the pieces' starts
    while lo < hi do
        local mid = floor((lo + hi) / 2)
        if pending[mid][1] <= start then lo = mid + 1 else hi = mid end
    end
    local i = lo
    if i > 1 and pending[i - 1][2] > start then i = i - 1 end
    local cursor, new_pieces = start, {}
    while i <= #pending and pending[i][1] < stop do
        local piece_start, piece_stop = pending[i][1], pending[i][2]
        if piece_start > cursor then new_pieces[#new_pieces + 1] = { cursor, piece_start } end
        cursor = max(cursor, piece_stop)
        i = i + 1
    end
    if cursor < stop then new_pieces[#new_pieces + 1] = { cursor, stop } end
    local keep = wants_bytes(s)
    for _, piece in ipairs(new_pieces) do
        local a, b = piece[1], piece[2]
        local data = false
        if src then data = keep and bytes_of(src, off + a - start, b - a) or true end
        lo, hi = 1, #pending + 1                    -- insort_right
        while lo < hi do
            local mid = floor((lo + hi) / 2)
            if pending[mid][1] <= a then lo = mid + 1 else hi = mid end
        end
        table.insert(pending, lo, { a, b, data, frame })
        if data then s.buffered = s.buffered + b - a end
    end
end

-- A segment that is not simply the next bytes: old, overlapping, or beyond a hole.
local function accept(s, start, src, off, captured, size, ts, frame)
    local next_offset = s.next_offset
    if start < next_offset then            -- retransmission: keep only what is new
        local repeated = min(next_offset - start, size)
        local repeated_captured = min(repeated, captured)
        off, captured = off + repeated_captured, captured - repeated_captured
        size = size - repeated
        start = next_offset
        if size == 0 then return end
    end
    if start == next_offset and #s.pending == 0 then
        deliver(s, src, off, captured, size, frame)
        check_fin(s)
        return
    end
    local captured_end = start + captured
    buffer(s, start, captured_end, src, off, frame)
    if captured_end < start + size then buffer(s, captured_end, start + size, nil, 0, frame) end
    drain(s)
    while s.buffered > MAX_BUFFERED_BYTES_PER_STREAM do skip_hole(s, frame) end   -- give up waiting
    resolve_acked(s, ts, frame)
end

local function teardown(s, flags, end_seq, ts, frame)
    if band(flags, TCP_RST) ~= 0 then       -- the sender retransmits nothing after a reset
        flush(s, nil, frame)
        if not s.ended then end_stream(s, frame) end
    elseif not s.fin_seen then             -- the FIN takes the sequence number after the payload
        s.fin_seen = true
        s.fin_offset = max(offset_of(s, end_seq), s.next_offset)
        s.fin_ts, s.fin_frame = ts, frame
        check_fin(s)
        resolve_acked(s, ts, frame)
    end
end

-- One TCP segment, in capture order (first pass only). src/off: where its captured payload is.
local function feed_segment(src_ip, sport, dst_ip, dport, seq, ack, flags, payload, off, captured, size, ts)
    local frame = capture.frame
    local key = sformat("%s|%d>%s|%d", src_ip, sport, dst_ip, dport)
    local reverse_key = sformat("%s|%d>%s|%d", dst_ip, dport, src_ip, sport)
    local s = capture.by_key[key]
    if band(flags, TCP_SYN) ~= 0 then
        if s == nil or s.ended or s.isn ~= seq then     -- not a retransmitted SYN
            if s and not s.ended then end_unseen(s, frame) end
            s = start_stream(key, reverse_key, src_ip, sport, dst_ip, dport, ts, true, (seq + 1) % SEQ_MODULUS)
        end
        seq = (seq + 1) % SEQ_MODULUS                    -- the SYN takes one sequence number
    elseif s == nil then
        s = start_stream(key, reverse_key, src_ip, sport, dst_ip, dport, ts, false, seq)
    end
    s.last_ts, s.last_frame = ts, frame
    if not s.ended then
        if size > 0 then
            if seq == s.next_seq and #s.pending == 0 and s.fin_offset == nil then
                deliver(s, payload, off, captured, size, frame)      -- the common case: the next bytes
            else
                accept(s, offset_of(s, seq), payload, off, captured, size, ts, frame)
            end
        end
        if band(flags, TCP_FIN + TCP_RST) ~= 0 then teardown(s, flags, (seq + size) % SEQ_MODULUS, ts, frame) end
    end
    if band(flags, TCP_ACK) ~= 0 then
        local other = capture.by_key[reverse_key]
        if other and not other.ended then
            local acked = offset_of(other, ack)
            if acked > other.acked_offset then
                if other.acked_offset <= other.next_offset then other.acked_ts = ts end   -- a hole starts to look lost
                other.acked_offset = acked
            end
            resolve_acked(other, ts, frame)
        end
    end
    if s.acked_offset > s.next_offset then resolve_acked(s, ts, frame) end
end

-- End of the capture (the first pass is over): what is still open ends, and each decoder with it.
local function finish_capture()
    capture.frame = capture.last_frame
    for _, s in ipairs(capture.streams) do
        if capture.by_key[s.key] == s and not s.ended then end_unseen(s, s.last_frame) end
    end
    for _, s in ipairs(capture.streams) do
        if s.owner == "pslite" then
            s.ps.zmtp:receive_end()
            drain_pslite(s)
        end
    end
end

-- ---------------------------------------------------------------------------------------------------
-- ps-lite across the capture (decoders/pslite_job.py): node ids, roles, tensors
-- ---------------------------------------------------------------------------------------------------

local function node_role(id)
    if id == nil or id < 1 then return nil end
    if id == SCHEDULER_ID then return "scheduler" end
    if id < 8 then return "group" end
    return id % 2 == 0 and "server" or "worker"
end

local function only_member(set)
    local found, n = nil, 0
    for id in pairs(set or {}) do found, n = id, n + 1 end
    return n == 1 and found or nil
end

local function identity_id(s)
    return s and s.ps and parse_identity(s.ps.zmtp.identity) or nil
end

-- Packet addresses are strings as Wireshark shows them (with network name resolution on, host names): the
-- addresses in ps-lite's node lists are read the same way.
local shown_addresses = {}
local function as_shown(host)
    local shown = shown_addresses[host]
    if shown == nil then
        shown = host:match("^%d+%.%d+%.%d+%.%d+$") and tostring(Address.ip(host)) or host
        shown_addresses[host] = shown
    end
    return shown
end

-- Each ps-lite direction's (sender, receiver) node ids (pslite_job.py _resolve_endpoints). The sender is
-- named by the DEALER's Identity "ps<id>", by the bytedance routing frames of a ROUTER's answers, or by
-- the host:port its ADD_NODE request announced; the receiver by the listening host:port in the scheduler's
-- ADD_NODE reply, by the other direction's Identity (routed answers), by the only other node at the
-- destination address, or as the scheduler for a direction that carried control requests.
local function resolve_endpoints()
    local addr_to_id = {}
    for id, node in pairs(capture.nodes) do addr_to_id[as_shown(node.hostname) .. ":" .. tostring(node.port)] = id end
    local sender = {}
    for _, s in ipairs(capture.streams) do
        if s.ps and s.ps.is_pslite then
            local id = identity_id(s) or capture.routed[s]
            if id == nil then
                for _, node in ipairs(capture.announced[s] or {}) do
                    id = addr_to_id[as_shown(node.hostname) .. ":" .. tostring(node.port)]
                    if id then break end
                end
            end
            sender[s] = id or false
        end
    end
    local ip_ids = {}
    local function learn(ip, id)
        ip_ids[ip] = ip_ids[ip] or {}
        ip_ids[ip][id] = true
    end
    for _, s in ipairs(capture.streams) do if sender[s] then learn(s.src, sender[s]) end end
    for id, node in pairs(capture.nodes) do learn(as_shown(node.hostname), id) end
    for _, s in ipairs(capture.streams) do
        if sender[s] ~= nil then
            local snd = sender[s] or only_member(ip_ids[s.src])
            local rcv = addr_to_id[s.dst .. ":" .. tostring(s.dport)]
            if rcv == nil and capture.routed[s] then rcv = identity_id(capture.by_key[s.reverse_key]) end
            if rcv == nil then
                local peers = {}
                for id in pairs(ip_ids[s.dst] or {}) do if id ~= snd then peers[id] = true end end
                local peer = only_member(peers)
                if peer and s.dst ~= s.src then
                    rcv = peer
                elseif capture.control_requests[s] then
                    rcv = SCHEDULER_ID
                end
            end
            s.sender, s.recver = snd, rcv
        end
    end
end

-- (request type, dtype) of a head: Cantor's pairing head = (t + d)(t + d + 1)/2 + d (tensors/head.py).
local function unpair_head(head, dtypes)
    if head < 0 then return nil end
    local w = floor((math.sqrt(8 * head + 1) - 1) / 2)
    while (w + 1) * (w + 2) / 2 <= head do w = w + 1 end
    while w * (w + 1) / 2 > head do w = w - 1 end
    local dtype = head - w * (w + 1) / 2
    local req = w - dtype
    if REQUEST_TYPES[req] == nil or dtypes[dtype] == nil then return nil end
    return REQUEST_TYPES[req], dtypes[dtype]
end

-- The tensor behind a KV message to or from server `rank` of `servers` (tensors/mxnet.py, tensors/byteps.py):
-- server r owns ps keys [r * floor((2^64-1)/S), (r+1) * floor((2^64-1)/S)) (Postoffice::GetServerKeyRanges).
local function attribute_keys(flavor, keys, lens, rank, servers, req_type)
    if rank >= servers or #keys == 0 then return nil end
    local width = UInt64.max() / servers
    local first, stop = width * rank, width * (rank + 1)
    if flavor == "byteps" then              -- (declared tensor << 16) + partition, from the first key
        if keys[1] < first or keys[1] >= stop then return nil end
        local offset = keys[1] - first
        return offset:rshift(16), offset:band(0xFFFF):tonumber()
    end
    for _, key in ipairs(keys) do
        if key < first or key >= stop then return nil end
    end
    local tensor
    if req_type == "default" then
        if #keys ~= 1 then return nil end
        tensor = keys[1] - first
    elseif req_type == "row_sparse" then        -- [the master key (len 0), master + row...]
        if lens and #lens > 0 and lens[1] ~= 0 then return nil end
        for k = 2, #keys do if keys[k] < keys[1] then return nil end end
        tensor = keys[1] - first
    elseif #keys == 2 then                      -- compressed push: [original elements (len 0), key]
        tensor = keys[2] - first
    elseif #keys == 1 then
        tensor = keys[1] - first
    else
        return nil
    end
    -- a tensor below MXNET_KVSTORE_BIGARRAY_BOUND goes whole to server (key * 9973) % S (int arithmetic):
    -- one on another server is a slice of a big array, its part the server rank
    local low = (tensor * MX_HOME_SERVER_FACTOR):band(0xFFFFFFFF):tonumber()
    local product = low >= SEQ_HALF and low - TWO32 or low
    local part = nil
    if product >= 0 and product % servers ~= rank then part = rank end
    return tensor, part
end

-- Sender, receiver, roles and tensor of every ps-lite message (pslite_job.py resolve_pslite): once, after
-- the first pass; without -2, a message is resolved when shown, with what has been read so far.
local function resolve_messages(messages)
    resolve_endpoints()
    local role_of = {}
    for id, node in pairs(capture.nodes) do role_of[id] = NODE_ROLES[node.role] or tostring(node.role) end
    role_of[SCHEDULER_ID] = role_of[SCHEDULER_ID] or "scheduler"
    local servers, rank_of = 0, {}
    local function count_server(id)
        if id and rank_of[id] == nil then
            rank_of[id] = (id - 8) / 2
            servers = servers + 1
        end
    end
    for id, role in pairs(role_of) do if role == "server" then count_server(id) end end
    for _, s in ipairs(capture.streams) do
        if node_role(s.sender) == "server" then count_server(s.sender) end
        if node_role(s.recver) == "server" then count_server(s.recver) end
    end
    local requests = {}
    local function request_key(snd, rcv, meta)
        return sformat("%s %s %s %s", tostring(snd), tostring(rcv), tostring(meta.customer_id), tostring(meta.timestamp))
    end
    for _, event in ipairs(messages) do
        local msg, s = event.ps, event.stream
        local meta = msg.meta
        msg.sender, msg.recver = s.sender or nil, s.recver
        msg.sender_role = msg.sender and (role_of[msg.sender] or node_role(msg.sender))
        msg.recver_role = msg.recver and (role_of[msg.recver] or node_role(msg.recver))
        msg.tensor_key, msg.part, msg.server_rank, msg.req_type, msg.dtype, msg.app_command = nil
        if meta.control_cmd == nil and meta.head ~= nil then
            local server = (msg.sender_role == "server" and msg.sender) or (msg.recver_role == "server" and msg.recver) or nil
            if server then msg.server_rank = rank_of[server] end
            if meta.simple_app then
                if meta.flavor == "dmlc" then msg.app_command = MX_SIMPLE_APP[meta.head] end
            else
                msg.req_type, msg.dtype = unpair_head(meta.head, meta.flavor == "dmlc" and MX_DTYPES or BYTEPS_DTYPES)
                if msg.req_type and server and #msg.keys > 0 and servers > 0 then
                    msg.tensor_key, msg.part = attribute_keys(meta.flavor, msg.keys, msg.lens, msg.server_rank,
                                                              servers, msg.req_type)
                end
            end
        end
        if meta.request and msg.tensor_key ~= nil then
            requests[request_key(msg.sender, msg.recver, meta)] = msg
        end
    end
    -- a response without keys (a plain push response) names its tensor through its request: ps-lite echoes
    -- the request's customer id and timestamp, the other way between the same two nodes
    for _, event in ipairs(messages) do
        local msg = event.ps
        local meta = msg.meta
        if not meta.request and msg.tensor_key == nil and meta.control_cmd == nil then
            local request = requests[request_key(msg.recver, msg.sender, meta)]
            if request then
                msg.tensor_key, msg.part, msg.req_type, msg.dtype = request.tensor_key, request.part,
                                                                    request.req_type, request.dtype
            end
        end
    end
end

-- ---------------------------------------------------------------------------------------------------
-- Display: what a packet completed, under zmtp / pslite / gloo
-- ---------------------------------------------------------------------------------------------------

local function flags_text(flags)
    local names = {}
    if band(flags, FLAG_MORE) ~= 0 then names[#names + 1] = "MORE" end
    if band(flags, FLAG_LONG) ~= 0 then names[#names + 1] = "LONG" end
    if band(flags, FLAG_COMMAND) ~= 0 then names[#names + 1] = "COMMAND" end
    return sformat("0x%02x%s", flags, #names > 0 and " (" .. concat(names, ", ") .. ")" or "")
end

-- One ZMTP frame: its flags and size (ZMTP 3.x: MORE 1, LONG 2 (8-byte size), COMMAND 4).
local function add_frame(tree, index, flags, size, range)
    local ft = range and tree:add(zf.frame, range) or tree:add(zf.frame)
    ft:set_text(sformat("Frame %d: %d bytes, flags %s", index, size, flags_text(flags)))
    local fl = ft:add(zf.flags, flags)
    fl:add(zf.flag_more, flags)
    fl:add(zf.flag_long, flags)
    fl:add(zf.flag_command, flags)
    ft:add(zf.size, UInt64.new(size))
    return ft
end

local function add_zmtp(tree, kind, stream, text)
    local t = tree:add(zmtp)
    t:set_text("ZeroMQ Message Transport Protocol, " .. text)
    t:add(zf.pdu, kind):set_generated()
    t:add(zf.flow, stream.flow):set_generated()
    return t
end

local function show_greeting(tree, r)
    local t = add_zmtp(tree, "greeting", r.stream, sformat("Greeting (%s)", r.version))
    t:add(zf.version, r.version):set_generated()
    t:add(zf.mechanism, r.mechanism):set_generated()
    t:add(zf.as_server, r.as_server):set_generated()
    if r.socket_type then t:add(zf.socket_type, r.socket_type):set_generated() end
    t:add(zf.last_byte_frame, r.last):set_generated()
    return sformat("ZMTP greeting %s %s%s", r.version, r.mechanism, r.as_server and " as-server" or "")
end

local function show_command(tree, r)
    local name = r.name ~= "" and r.name or "?"
    local t = add_zmtp(tree, "command", r.stream, sformat("Command %s (%d bytes)", name, r.size))
    t:add(zf.command, r.name):set_generated()
    add_frame(t, 1, r.flags, r.size)
    t:add(zf.first_frame, r.first):set_generated()
    t:add(zf.last_byte_frame, r.last):set_generated()
    t:add(zf.complete, r.complete):set_generated()
    if not r.complete then t:add_proto_expert_info(ex.incomplete) end
    local details = {}
    if r.stream.ps.zmtp.encrypted then t:add(zf.encrypted, true):set_generated() end
    for k, prop in ipairs(r.names or {}) do
        local value = r.values[k]
        local pt = t:add(zf.property)
        pt:set_text(sformat("%s: %s", printable(prop), printable(value)))
        pt:add(zf.prop_name, prop)
        local lower = prop:lower()
        if lower == "socket-type" then
            pt:add(zf.socket_type, value)
        elseif lower == "identity" then
            pt:add(zf.identity, value)
        else
            pt:add(zf.prop_value, printable(value))
        end
        details[#details + 1] = sformat("%s=%s", printable(prop), printable(value))
    end
    local body, at = r.body, 2 + (r.body and sbyte(r.body, 1) or 0)
    if body and r.name == "ERROR" and at <= #body then
        local reason = ssub(body, at + 1, at + sbyte(body, at))
        t:add(zf.error_reason, reason)
        details[#details + 1] = printable(reason)
    elseif body and r.name == "PING" and at + 1 <= #body then
        t:add(zf.ping_ttl, sbyte(body, at) * 256 + sbyte(body, at + 1))
    elseif body and (r.name == "SUBSCRIBE" or r.name == "CANCEL") then
        local topic = ssub(body, at)
        t:add(zf.topic, topic)
        details[#details + 1] = printable(topic)
    end
    if r.username then
        t:add(zf.username, r.username)
        details[#details + 1] = "user " .. printable(r.username)
    end
    return "ZMTP " .. (r.name ~= "" and r.name or "command") .. (#details > 0 and " " .. concat(details, " ") or "")
end

local function add_opt_int(tree, field, tvb, item)
    if item == nil then return end
    local ti = tree:add(field, tvb(item.field_off, item.field_len), item.value)
    if item.value == K_EMPTY then ti:append_text(" (kEmpty: unset)") end
end

local function node_text(k, n)
    return sformat("Node %d: %s id=%s %s:%s", k, ROLES[n.role] or tostring(n.role), tostring(n.id),
                   printable(n.hostname), tostring(n.port))
end

-- The meta as it is on the wire, from the data source of the message's kept frames (meta at `at`).
local function add_dmlc_meta_tree(tree, tvb, frame, at)
    local meta = dmlc_meta(frame, false, at)
    local pb = meta.pb
    add_opt_int(tree, pf.m_head, tvb, pb.head)
    if pb.body and pb.body.len > 0 then tree:add(pf.m_body, tvb(pb.body.off, pb.body.len)) end
    if pb.control then
        local c = pb.control.value
        local ct = tree:add(pf.m_control, tvb(pb.control.field_off, pb.control.field_len), c.cmd.value)
        add_opt_int(ct, pf.m_barrier_group, tvb, c.barrier_group)
        if c.msg_sig then ct:add(pf.m_msg_sig, tvb(c.msg_sig.field_off, c.msg_sig.field_len), c.msg_sig.value) end
        for k, n in ipairs(meta.nodes) do
            local nt = ct:add(pf.node, tvb(n.item.off, n.item.len))
            nt:set_text(node_text(k, n))
            local p = n.pb
            nt:add(pf.node_role, tvb(p.role.field_off, p.role.field_len), p.role.value)
            add_opt_int(nt, pf.node_id, tvb, p.id)
            if p.hostname then
                nt:add(pf.node_hostname, tvb(p.hostname.field_off, p.hostname.field_len), p.hostname.value)
            end
            add_opt_int(nt, pf.node_port, tvb, p.port)
            if p.is_recovery then
                nt:add(pf.node_is_recovery, tvb(p.is_recovery.field_off, p.is_recovery.field_len), p.is_recovery.value)
            end
            add_opt_int(nt, pf.node_customer_id, tvb, p.customer_id)
        end
    end
    for _, name in ipairs({ "request", "push", "simple_app" }) do
        local item = pb[name]
        if item then tree:add(pf["m_" .. name], tvb(item.field_off, item.field_len), item.value) end
    end
    add_opt_int(tree, pf.m_app_id, tvb, pb.app_id)
    add_opt_int(tree, pf.m_timestamp, tvb, pb.timestamp)
    for _, t in ipairs(pb.data_type or {}) do tree:add(pf.m_data_type, tvb(t.off, t.len), t.value) end
    add_opt_int(tree, pf.m_customer_id, tvb, pb.customer_id)
    add_opt_int(tree, pf.m_data_size, tvb, pb.data_size)
    if pb.pull then tree:add(pf.m_pull, tvb(pb.pull.field_off, pb.pull.field_len), pb.pull.value) end
    add_opt_int(tree, pf.m_priority, tvb, pb.priority)
end

local function add_byteps_meta_tree(tree, tvb, meta, at)
    local s = meta.raw
    local tail = meta.layout[3] and 64 or 48        -- offset of customer_id
    local function i32(field, off)
        local v = i32le(s, off + 1)
        local ti = tree:add(field, tvb(at + off, 4), v)
        if v == K_EMPTY then ti:append_text(" (kEmpty: unset)") end
    end
    i32(pf.m_head, 0)
    local ct = tree:add(pf.m_control, tvb(at + 8, 24), i32le(s, 9))
    if meta.barrier_group then ct:add(pf.m_barrier_group, tvb(at + 16, 4), meta.barrier_group) end
    if meta.msg_sig then ct:add(pf.m_msg_sig, tvb(at + 24, 8), meta.msg_sig) end
    for k, n in ipairs(meta.nodes) do
        local p = at + n.raw_at
        local nt = ct:add(pf.node, tvb(p, meta.layout[2]))
        nt:set_text(node_text(k, n))
        nt:add(pf.node_role, tvb(p, 4), n.role)
        nt:add(pf.node_id, tvb(p + 4, 4), n.id or K_EMPTY)
        nt:add(pf.node_hostname, tvb(p + 8, 64), n.hostname)
        nt:add(pf.node_port, tvb(p + (meta.layout[2] == 552 and 204 or 72), 4), n.port or K_EMPTY)
    end
    tree:add(pf.m_request, tvb(at + 32, 1), meta.request)
    i32(pf.m_app_id, 36)
    i32(pf.m_timestamp, 40)
    if meta.layout[3] then
        i32(pf.m_src_dev_type, 48); i32(pf.m_src_dev_id, 52); i32(pf.m_dst_dev_type, 56); i32(pf.m_dst_dev_id, 60)
    end
    i32(pf.m_customer_id, tail)
    tree:add(pf.m_push, tvb(at + tail + 4, 1), meta.push)
    tree:add(pf.m_simple_app, tvb(at + tail + 5, 1), meta.simple_app)
    i32(pf.m_data_size, tail + 8)
    tree:add_le(pf.m_key, tvb(at + tail + 16, 8))
    tree:add_le(pf.m_addr, tvb(at + tail + 24, 8))
    i32(pf.m_val_len, tail + 32)
    i32(pf.m_option, tail + 36)
    if meta.layout[4] then i32(pf.m_sid, 104) end
    if meta.body_at[2] > 0 then tree:add(pf.m_body, tvb(at + meta.body_at[1], meta.body_at[2])) end
    for k, t in ipairs(meta.data_types) do tree:add(pf.m_data_type, tvb(at + meta.data_types_at + 4 * (k - 1), 4), t) end
end

local function action_text(meta)
    if meta.control_cmd then return CONTROL_CMDS[meta.control_cmd] or tostring(meta.control_cmd) end
    if meta.simple_app then return "SimpleApp" end
    local what = (meta.push and "push" or "") .. ((meta.push and meta.pull) and "+" or "") .. (meta.pull and "pull" or "")
    return what ~= "" and what or "data"
end

-- The ps-lite message: one of each summary field (what filters and `-T fields` read), then the meta tree.
local function show_pslite(tree, r, mtvb, at)
    local msg, meta = r.ps, r.ps.meta
    local pt = mtvb and tree:add(pslite, mtvb()) or tree:add(pslite)
    local text = sformat("ps-lite %s→%s %s%s", msg.sender and tostring(msg.sender) or "?",
                         msg.recver and tostring(msg.recver) or "?", action_text(meta), meta.request and " request" or
                         ((meta.control_cmd or meta.simple_app) and "" or " response"))
    if meta.timestamp then text = text .. " ts=" .. meta.timestamp end
    if #msg.keys > 0 then text = text .. " keys=" .. #msg.keys end
    if not r.complete then text = text .. " (incomplete)" end
    pt:set_text(text)
    pt:add(pf.flow, r.stream.flow):set_generated()
    pt:add(pf.flavor, meta.flavor):set_generated()
    pt:add(pf.last_byte_frame, r.last):set_generated()
    pt:add(pf.complete, r.complete):set_generated()
    if msg.sender then
        pt:add(pf.sender, msg.sender):set_generated()
        if msg.sender_role then pt:add(pf.sender_role, msg.sender_role):set_generated() end
    end
    if msg.recver then
        pt:add(pf.recver, msg.recver):set_generated()
        if msg.recver_role then pt:add(pf.recver_role, msg.recver_role):set_generated() end
    end
    if msg.routing then pt:add(pf.routing_id, mtvb(at[1], #msg.routing)) end
    pt:add(pf.request, meta.request):set_generated()
    pt:add(pf.push, meta.push):set_generated()
    pt:add(pf.pull, meta.pull):set_generated()
    pt:add(pf.simple_app, meta.simple_app):set_generated()
    if meta.head then pt:add(pf.head, meta.head):set_generated() end
    if meta.timestamp then pt:add(pf.timestamp, meta.timestamp):set_generated() end
    if meta.app_id then pt:add(pf.app_id, meta.app_id):set_generated() end
    if meta.customer_id then pt:add(pf.customer_id, meta.customer_id):set_generated() end
    if meta.control_cmd then pt:add(pf.control, meta.control_cmd):set_generated() end
    if meta.barrier_group then pt:add(pf.barrier_group, meta.barrier_group):set_generated() end
    pt:add(pf.size, UInt64.new(msg.size)):set_generated()
    for k, size in ipairs(msg.data_sizes) do
        if size then
            pt:add(pf.data_sizes, UInt64.new(size)):set_generated()
        else
            pt:add(pf.data_size_unknown, k - 1):set_generated()
        end
    end
    local mi = msg.meta_index
    local kt = pt:add(pf.num_keys, #msg.keys)
    kt:set_generated()
    for j = 0, #msg.keys - 1 do kt:add_le(pf.key, mtvb(at[mi + 1] + 8 * j, 8)) end
    if msg.lens then
        local lt = pt:add(pf.lens, mtvb(at[mi + 3], 4 * #msg.lens))
        lt:set_text(sformat("Lens (%d)", #msg.lens))
        for j = 0, #msg.lens - 1 do lt:add_le(pf.len, mtvb(at[mi + 3] + 4 * j, 4)) end
    end
    if msg.req_type then
        pt:add(pf.req_type, msg.req_type):set_generated()
        pt:add(pf.dtype, msg.dtype):set_generated()
    end
    if msg.app_command then pt:add(pf.app_command, msg.app_command):set_generated() end
    if msg.server_rank then pt:add(pf.server_rank, msg.server_rank):set_generated() end
    if msg.tensor_key then pt:add(pf.tensor_key, msg.tensor_key):set_generated() end
    if msg.part then pt:add(pf.part, msg.part):set_generated() end
    local mt = r.sizes[mi] > 0 and pt:add(pf.meta, mtvb(at[mi], r.sizes[mi])) or pt:add(pf.meta, "")
    mt:set_text(sformat("Meta (%s, %d bytes)", meta.flavor == "dmlc" and "protobuf ps.PBMeta" or
                        sformat("RawMeta %d/%d", meta.layout[1], meta.layout[2]), r.sizes[mi]))
    if meta.flavor == "dmlc" then
        add_dmlc_meta_tree(mt, mtvb, r.bodies[mi], at[mi])
    else
        add_byteps_meta_tree(mt, mtvb, meta, at[mi])
    end
    return text
end

local function show_message(tree, r)
    local sizes, total = r.sizes, 0
    for _, size in ipairs(sizes) do total = total + size end
    local t = add_zmtp(tree, "message", r.stream,
                       sformat("Message (%d frame%s, %d bytes)", #sizes, #sizes == 1 and "" or "s", total))
    t:add(zf.frames, #sizes):set_generated()
    t:add(zf.message_size, UInt64.new(total)):set_generated()
    t:add(zf.first_frame, r.first):set_generated()
    t:add(zf.last_byte_frame, r.last):set_generated()
    t:add(zf.complete, r.complete):set_generated()
    if not r.complete then t:add_proto_expert_info(ex.incomplete) end
    -- the kept bodies (routing frame, meta, keys, lens; small frames) as a data source of their own
    local kept, at, pos = {}, {}, 0
    for k, body in ipairs(r.bodies) do
        if body then
            kept[#kept + 1] = body
            at[k] = pos
            pos = pos + #body
        end
    end
    local mtvb = pos > 0 and ByteArray.new(concat(kept), true):tvb("ZMTP message (kept frames)") or nil
    for k, size in ipairs(sizes) do
        local range = at[k] and size > 0 and mtvb(at[k], size) or nil
        local ft = add_frame(t, k, r.flags[k], size, range)
        if range then ft:add(zf.body, range) end
    end
    if r.ps then return show_pslite(tree, r, mtvb, at) end
    if r.undecoded then
        t:add(zf.reason, "not a ps-lite message: " .. r.undecoded)
    end
    return sformat("ZMTP message %d frame%s %d bytes%s", #sizes, #sizes == 1 and "" or "s", total,
                   r.complete and "" or " (incomplete)")
end

local function show_resync(tree, r)
    local t = add_zmtp(tree, "resync", r.stream, sformat("framing lost, found again %d bytes later", r.lost))
    t:add(zf.lost_bytes, UInt64.new(r.lost)):set_generated()
    t:add(zf.reason, r.reason):set_generated()
    t:add_proto_expert_info(ex.resync)
    return "ZMTP resync after " .. r.lost .. " bytes"
end

local function show_failed(tree, r)
    local t = add_zmtp(tree, "failed", r.stream, "decoding stopped")
    t:add(zf.reason, r.reason):set_generated()
    t:add_proto_expert_info(ex.failed)
    return "ZMTP decoding stopped"
end

local function show_gloo(tree, r)
    local s = r.preamble
    local pre = ByteArray.new(s, true):tvb("Gloo preamble")
    local opcode, prefix = u32le(s, 9), sbyte(s, 24)
    local nbytes = u64le_number(s, 1)
    local tag = prefix == 0 and u64le_number(s, 17) or u32le(s, 20)
    local gt = tree:add(gloo, pre())
    gt:set_text(sformat("Gloo %s, %s #%s, %d bytes", GLOO_OPCODES[opcode], GLOO_PREFIXES[prefix], tostring(tag), nbytes))
    gt:add(gf.flow, r.stream.flow):set_generated()
    gt:add_le(gf.nbytes, pre(0, 8))
    gt:add_le(gf.opcode, pre(8, 8))
    local st = gt:add_le(gf.slot, pre(16, 8))
    st:add(gf.prefix, pre(23, 1))
    if prefix ~= 0 then
        st:add(gf.tag, pre(19, 4), tag)
        st:add(gf.delta, pre(16, 1))
    end
    gt:add_le(gf.offset, pre(24, 8))
    gt:add_le(gf.length, pre(32, 8))
    gt:add_le(gf.roffset, pre(40, 8))
    gt:add(gf.missing_bytes, UInt64.new(r.missing)):set_generated()
    gt:add(gf.first_frame, r.first):set_generated()
    gt:add(gf.last_byte_frame, r.last):set_generated()
    gt:add(gf.complete, r.complete):set_generated()
    if not r.complete then gt:add_proto_expert_info(ex.gloo_incomplete) end
    return sformat("Gloo %s %s #%s %d bytes%s", GLOO_OPCODES[opcode], GLOO_PREFIXES[prefix], tostring(tag), nbytes,
                   r.complete and "" or " (incomplete)")
end

local function show_gloo_connect(tree, r)
    local gt = tree:add(gloo)
    gt:set_text(sformat("Gloo pair connect, sequence number %d", r.sequence))
    gt:add(gf.flow, r.stream.flow):set_generated()
    gt:add(gf.sequence, Int64.new(r.sequence)):set_generated()
    return sformat("Gloo connect seq %d", r.sequence)
end

local function show_gloo_resync(tree, r)
    local gt = tree:add(gloo)
    gt:set_text(sformat("Gloo, framing lost, preamble found again %d bytes later", r.lost))
    gt:add(gf.flow, r.stream.flow):set_generated()
    gt:add(gf.lost_bytes, UInt64.new(r.lost)):set_generated()
    gt:add(gf.reason, r.reason):set_generated()
    gt:add_proto_expert_info(ex.gloo_resync)
    return "Gloo resync after " .. r.lost .. " bytes"
end

local SHOW = { greeting = show_greeting, command = show_command, message = show_message, resync = show_resync,
               failed = show_failed, gloo = show_gloo, gloo_connect = show_gloo_connect,
               gloo_resync = show_gloo_resync }
local PROTOCOL_COLUMN = { pslite = "ZMTP", gloo = "Gloo" }

local function show_results(pinfo, tree)
    local results = capture.results[pinfo.number]
    if results == nil then return end
    if not pinfo.visited then         -- first pass: node ids and tensors from what has been read so far
        local messages = {}
        for _, r in ipairs(results) do if r.ps then messages[#messages + 1] = r end end
        if #messages > 0 then resolve_messages(messages) end
    end
    local texts, protocol = {}, nil
    for _, r in ipairs(results) do
        texts[#texts + 1] = SHOW[r.kind](tree, r)
        protocol = r.ps and "ps-lite" or protocol or PROTOCOL_COLUMN[r.stream.owner]
    end
    pinfo.cols.protocol = protocol
    pinfo.cols.info:clear_fence()
    pinfo.cols.info:set(concat(texts, " | "))
end

-- ---------------------------------------------------------------------------------------------------
-- Registration
-- ---------------------------------------------------------------------------------------------------

local ip_proto_table = DissectorTable.get("ip.proto")
local tcp_dissector = ip_proto_table:get_dissector(6)

-- A TCP segment as dlcsniff reads it (decoders/packet.py): header length from the data offset; the
-- payload the IP length claims (`reported`), of which the capture holds the first `captured` bytes.
local function read_segment(tvb, pinfo)
    local captured_len, reported_len = tvb:len(), tvb:reported_len()
    if captured_len < 20 then return end
    local h = tvb:raw(0, 20)
    local header_len = floor(sbyte(h, 13) / 16) * 4
    if header_len < 20 or header_len > reported_len or header_len > captured_len then return end
    local ts = floor(pinfo.abs_ts * 1e6 + 0.5)
    capture.frame = pinfo.number
    capture.last_frame = pinfo.number
    feed_segment(tostring(pinfo.src), sbyte(h, 1) * 256 + sbyte(h, 2), tostring(pinfo.dst),
                 sbyte(h, 3) * 256 + sbyte(h, 4), u32be(h, 5), u32be(h, 9), sbyte(h, 14), tvb, header_len,
                 captured_len - header_len, reported_len - header_len, ts)
end

function tracker.init()
    reset_capture()
end

-- The first pass is over when a packet is dissected again (tshark -2's second pass; in the GUI, a click or a
-- filter). tshark: what is still open ends there, as at the end of dlcsniff's decode. The GUI may still be
-- capturing: nothing ends, and node ids and tensors are worked out again whenever messages came since.
local function catch_up()
    if not capture.finished and not gui_enabled() then
        finish_capture()
        capture.finished = true
    end
    if capture.resolved ~= #capture.messages then
        resolve_messages(capture.messages)
        capture.resolved = #capture.messages
    end
end

-- TCP hands the payload of the directions this script decodes to zmtp or gloo, instead of "Data" or a
-- dissector of the port (SIGCOMP has 5555): they take it, the tracker shows what it completed. The first
-- packets come to them as a heuristic; the tracker then makes them the connection's dissector, which TCP
-- asks before any other.
local OWNER_PROTO = { pslite = zmtp, gloo = gloo }

local function stream_of(pinfo)
    return capture.by_key[sformat("%s|%d>%s|%d", tostring(pinfo.src), pinfo.src_port, tostring(pinfo.dst),
                                  pinfo.dst_port)]
end

local function claim_payload(owner)
    return function(tvb, pinfo, tree)
        local s = stream_of(pinfo)
        if s == nil or s.owner ~= owner then return 0 end
        pinfo.cols.protocol = PROTOCOL_COLUMN[owner]
        return tvb:len()
    end
end

-- (the Lua functions themselves: reading proto.dissector back gives a dissector handle, one layer down)
for owner, proto in pairs(OWNER_PROTO) do
    local claim = claim_payload(owner)
    proto.dissector = claim
    proto:register_heuristic("tcp", function(tvb, pinfo, tree) return claim(tvb, pinfo, tree) > 0 end)
end

function tracker.dissector(tvb, pinfo, tree)
    if not pinfo.visited then
        if not pinfo.in_error_pkt then read_segment(tvb, pinfo) end
    else
        catch_up()
    end
    local consumed = tcp_dissector:call(tvb, pinfo, tree)
    if pinfo.in_error_pkt then return consumed end
    if not pinfo.visited then
        local s = stream_of(pinfo)      -- TCP has set the ports now
        if s and OWNER_PROTO[s.owner] and not s.conversation_set then
            pinfo.conversation = OWNER_PROTO[s.owner]
            s.conversation_set = true
        end
    end
    show_results(pinfo, tree)
    return consumed
end
ip_proto_table:add(6, tracker)
