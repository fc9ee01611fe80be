-- ---------------------------------------------------------------------------------------------------
-- ZMTP, one direction (decoders/protocols/zmtp/decoder.py): bytes and gaps in, events out
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

