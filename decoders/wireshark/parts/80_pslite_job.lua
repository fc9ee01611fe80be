-- ps-lite across the capture (decoders/protocols/pslite/job.py): node ids, roles, tensors
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

-- Each ps-lite direction's (sender, receiver) node ids (decoders/protocols/pslite/job.py _resolve_endpoints). The sender is
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

-- Sender, receiver, roles and tensor of every ps-lite message (decoders/protocols/pslite/job.py resolve_pslite): once, after
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
