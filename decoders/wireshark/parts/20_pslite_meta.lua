-- ---------------------------------------------------------------------------------------------------
-- ps-lite metas: dmlc/ps-lite's protobuf ps.PBMeta, bytedance/ps-lite's raw structs (decoders/protocols/pslite/decoder.py)
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

-- src/meta.proto (decoders/protocols/pslite/meta.py)
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

