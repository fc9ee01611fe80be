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

