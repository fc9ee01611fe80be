/* The batch decoder's header reader, compiled: the TCP segments of a batch of captured packets whose link, IP
 * and TCP headers need no second look, with the fields the bulk path uses.
 *
 * dlcsniff.decoders._tcp_headers, built by `make setup` (pyproject.toml: ext-modules). The contract is
 * decoders/tcp_driver.py's `_Headers` (its numpy reader is the fallback and the reference the tests hold this
 * to: the same arrays on every bundled capture and on packets of every link type, IP version and header shape).
 *
 *   read(buf, start, caplen, linktype, linktypes) -> (index, sport, dport, seq, ack, flags, payload_start,
 *                                                     payload_len, wire_len, window, key)
 *       buf: the batch's read buffer; start, caplen: bytes of native int64s, per packet where its link-layer
 *       header starts in buf and how many bytes were captured; linktype: the batch's link type, or -1 when
 *       linktypes (bytes of int64s, per packet) gives each packet's. Every output but key is bytes of int64s, one
 *       per segment read (in batch order); key is 5 uint64s per segment: source address high and low 64 bits,
 *       destination high and low (IPv4: the address in the high word, 0 in the low), ip version << 32.
 *
 * A packet is read here when: its link header says IPv4 or IPv6 (Ethernet without VLAN tags, Linux cooked
 * v1/v2, BSD loopback, raw IP); IPv4 with a plausible header length and total length, no fragment, protocol TCP;
 * IPv6 without extension headers, a payload length, next header TCP; a TCP header whose data offset fits in the
 * IP payload and in the captured bytes. Anything else is left to parse_packet.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* LINKTYPE_* numbers (tcpdump.org/linktypes.html) */
enum { NULL_LINK = 0, ETHERNET = 1, RAW = 101, LOOP = 108, LINUX_SLL = 113, IPV4 = 228, IPV6 = 229, LINUX_SLL2 = 276 };
enum { FIELDS = 10, KEY_WORDS = 5, TCP_READ_BYTES = 14, IPV4_MIN_BYTES = 20, IPV6_HEADER_BYTES = 40, IPPROTO_TCP = 6 };

static uint64_t be(const unsigned char *p, int bytes)
{
    uint64_t value = 0;
    for (int k = 0; k < bytes; k++)
        value = (value << 8) | p[k];
    return value;
}

/* The IP version a packet's link header announces (4, 6, or 0: not read here) and where the IP header starts. */
static int link_layer(const unsigned char *p, int64_t caplen, int64_t linktype, int64_t *ip_at)
{
    int64_t type_at, header;
    switch (linktype) {
    case ETHERNET: type_at = 12; header = 14; break;
    case LINUX_SLL: type_at = 14; header = 16; break;
    case LINUX_SLL2: type_at = 0; header = 20; break;
    case NULL_LINK:
    case LOOP: {
        *ip_at = 4;
        if (caplen < 4)
            return 0;
        uint64_t little = (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24);
        uint64_t family = little > 0xFFFF ? be(p, 4) : little;   /* the capturing host's byte order */
        return family == 2 ? 4 : (family == 24 || family == 28 || family == 30) ? 6 : 0;
    }
    case RAW: {
        *ip_at = 0;
        if (caplen < 1)
            return 0;
        int nibble = p[0] >> 4;
        return nibble == 4 || nibble == 6 ? nibble : 0;
    }
    case IPV4: *ip_at = 0; return 4;
    case IPV6: *ip_at = 0; return 6;
    default: *ip_at = 0; return 0;
    }
    *ip_at = header;
    if (caplen < type_at + 2)
        return 0;
    uint64_t ethertype = be(p + type_at, 2);
    return ethertype == 0x0800 ? 4 : ethertype == 0x86DD ? 6 : 0;
}

static int as_int64s(Py_buffer *view, Py_ssize_t *count)
{
    if (view->len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "an int64 array's bytes are not a multiple of 8");
        return -1;
    }
    *count = view->len / (Py_ssize_t)sizeof(int64_t);
    return 0;
}

static PyObject *read_headers(PyObject *self, PyObject *args)
{
    Py_buffer buf, starts, caplens, linktypes;
    long long batch_linktype;
    if (!PyArg_ParseTuple(args, "y*y*y*Ly*", &buf, &starts, &caplens, &batch_linktype, &linktypes))
        return NULL;
    PyObject *outputs[FIELDS + 1] = {NULL};
    PyObject *result = NULL;
    Py_ssize_t n, n_caplen, n_linktypes;
    if (as_int64s(&starts, &n) < 0 || as_int64s(&caplens, &n_caplen) < 0 || as_int64s(&linktypes, &n_linktypes) < 0)
        goto done;
    if (n_caplen != n || (batch_linktype < 0 && n_linktypes != n)) {
        PyErr_SetString(PyExc_ValueError, "start, caplen and linktypes must have one entry per packet");
        goto done;
    }
    for (int f = 0; f < FIELDS; f++)
        outputs[f] = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    outputs[FIELDS] = PyBytes_FromStringAndSize(NULL, n * KEY_WORDS * (Py_ssize_t)sizeof(uint64_t));
    for (int f = 0; f <= FIELDS; f++)
        if (outputs[f] == NULL)
            goto done;
    int64_t *out[FIELDS];
    for (int f = 0; f < FIELDS; f++)
        out[f] = (int64_t *)PyBytes_AS_STRING(outputs[f]);
    uint64_t *key = (uint64_t *)PyBytes_AS_STRING(outputs[FIELDS]);
    const unsigned char *b = buf.buf;
    const int64_t *start = starts.buf, *caplen = caplens.buf, *linktype = linktypes.buf;
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = start[i], c = caplen[i], ip_at, tcp_at, ip_payload;
        if (s < 0 || c < 0 || s > buf.len || c > buf.len - s) {
            PyErr_SetString(PyExc_ValueError, "a packet lies outside the buffer");
            goto done;
        }
        const unsigned char *p = b + s;
        int version = link_layer(p, c, batch_linktype >= 0 ? batch_linktype : linktype[i], &ip_at);
        uint64_t words[KEY_WORDS];
        if (version == 4 && c >= ip_at + IPV4_MIN_BYTES) {
            const unsigned char *ip = p + ip_at;
            int64_t header_len = (ip[0] & 0x0F) * 4, total_len = (int64_t)be(ip + 2, 2);
            /* an unset total length (segmentation offload), fragments, options too long: parse_packet's business */
            if (ip[0] >> 4 != 4 || header_len < 20 || total_len < header_len || (be(ip + 6, 2) & 0x3FFF) ||
                ip[9] != IPPROTO_TCP)
                continue;
            words[0] = be(ip + 12, 4); words[1] = 0; words[2] = be(ip + 16, 4); words[3] = 0;
            words[4] = (uint64_t)4 << 32;
            tcp_at = ip_at + header_len;
            ip_payload = total_len - header_len;
        } else if (version == 6 && c >= ip_at + IPV6_HEADER_BYTES) {
            const unsigned char *ip = p + ip_at;
            int64_t payload_len = (int64_t)be(ip + 4, 2);
            /* extension headers, jumbograms: parse_packet's business */
            if (ip[0] >> 4 != 6 || payload_len <= 0 || ip[6] != IPPROTO_TCP)
                continue;
            words[0] = be(ip + 8, 8); words[1] = be(ip + 16, 8); words[2] = be(ip + 24, 8); words[3] = be(ip + 32, 8);
            words[4] = (uint64_t)6 << 32;
            tcp_at = ip_at + IPV6_HEADER_BYTES;
            ip_payload = payload_len;
        } else {
            continue;
        }
        /* TCP (RFC 9293): the header must be whole in the capture and within the IP payload */
        if (c < tcp_at + TCP_READ_BYTES)
            continue;
        const unsigned char *tcp = p + tcp_at;
        int64_t header_len = (int64_t)(tcp[12] >> 4) * 4;
        int64_t captured_end = tcp_at + ip_payload < c ? tcp_at + ip_payload : c;
        if (header_len < 20 || header_len > ip_payload || tcp_at + header_len > captured_end)
            continue;
        out[0][found] = i;
        out[1][found] = (int64_t)be(tcp, 2);
        out[2][found] = (int64_t)be(tcp + 2, 2);
        out[3][found] = (int64_t)be(tcp + 4, 4);
        out[4][found] = (int64_t)be(tcp + 8, 4);
        out[5][found] = tcp[13];
        out[6][found] = s + tcp_at + header_len;
        out[7][found] = captured_end - tcp_at - header_len;
        out[8][found] = ip_payload - header_len;
        out[9][found] = (int64_t)be(tcp + 14, 2);     /* header_len >= 20: the window is within the capture */
        for (int w = 0; w < KEY_WORDS; w++)
            key[found * KEY_WORDS + w] = words[w];
        found++;
    }
    for (int f = 0; f < FIELDS; f++)
        if (_PyBytes_Resize(&outputs[f], found * (Py_ssize_t)sizeof(int64_t)) < 0)
            goto done;
    if (_PyBytes_Resize(&outputs[FIELDS], found * KEY_WORDS * (Py_ssize_t)sizeof(uint64_t)) < 0)
        goto done;
    result = PyTuple_New(FIELDS + 1);
    if (result != NULL)
        for (int f = 0; f <= FIELDS; f++) {
            PyTuple_SET_ITEM(result, f, outputs[f]);
            outputs[f] = NULL;
        }
done:
    for (int f = 0; f <= FIELDS; f++)
        Py_XDECREF(outputs[f]);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&caplens);
    PyBuffer_Release(&linktypes);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_headers, METH_VARARGS,
     "read(buf, start, caplen, linktype, linktypes) -> (index, sport, dport, seq, ack, flags, payload_start, "
     "payload_len, wire_len, window, key)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tcp_headers", "The batch decoder's header reader (see decoders/tcp_driver.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__tcp_headers(void)
{
    return PyModule_Create(&module);
}
