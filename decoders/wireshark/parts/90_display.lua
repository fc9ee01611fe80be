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
