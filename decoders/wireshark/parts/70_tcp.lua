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
