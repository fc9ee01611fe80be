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
local NODE_ROLES = { [0] = "server", "worker", "scheduler" }    -- decoders/protocols/pslite/job.py names these, numbers the rest
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

