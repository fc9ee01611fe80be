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
