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

