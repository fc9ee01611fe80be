/* The hot loop of reading a capture, compiled: where the packet records lying whole in a read buffer start.
 *
 * dlcsniff.decoders.inputs._record_walk, built by `make setup` (pyproject.toml: ext-modules). The contract is
 * decoders/inputs/record_walk.py's, whose pure-Python functions are the fallback and the reference the tests
 * hold this to (same offsets, same stopping position, on every bundled capture and on damaged ones).
 *
 *   pcap_offsets(buf, pos, big_endian) -> (offsets, pos)
 *       pcap records (16-byte header: ts_sec, ts_frac, caplen, orig_len; the packet follows) from pos on, as
 *       long as a record's header and captured bytes lie whole in buf.
 *   epb_offsets(buf, pos, big_endian, interfaces) -> (offsets, pos)
 *       pcapng enhanced packet blocks (type 6) from pos on, as long as each is well-formed (length a multiple
 *       of 4, at least 32, inside buf; interface id below `interfaces`; captured bytes inside the block).
 *
 * offsets: bytes of native int64s (array("q").frombytes), the start of each record; pos: where the walk
 * stopped (the first record that is not whole, or not an enhanced packet block, or the end of buf).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PCAP_RECORD_HEADER_BYTES 16
#define EPB_TYPE 6u
#define EPB_MIN_BYTES 32
#define EPB_HEADER_BYTES 28

static uint32_t read_u32(const unsigned char *p, int big_endian)
{
    if (big_endian)
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | (uint32_t)p[0];
}

typedef Py_ssize_t (*next_record)(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int big_endian,
                                  uint64_t interfaces);

/* The next pcap record's start after the one at pos, or -1 when the one at pos is not whole in [0, end). */
static Py_ssize_t pcap_next(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int big_endian,
                            uint64_t interfaces)
{
    (void)interfaces;
    if (end - pos < PCAP_RECORD_HEADER_BYTES)
        return -1;
    uint32_t caplen = read_u32(b + pos + 8, big_endian);
    if ((uint64_t)caplen > (uint64_t)(end - pos - PCAP_RECORD_HEADER_BYTES))
        return -1;
    return pos + PCAP_RECORD_HEADER_BYTES + (Py_ssize_t)caplen;
}

/* The next block's start after the enhanced packet block at pos, or -1 when that one is not well-formed. */
static Py_ssize_t epb_next(const unsigned char *b, Py_ssize_t pos, Py_ssize_t end, int big_endian,
                           uint64_t interfaces)
{
    if (end - pos < EPB_MIN_BYTES)
        return -1;
    uint32_t block_type = read_u32(b + pos, big_endian);
    uint32_t block_len = read_u32(b + pos + 4, big_endian);
    uint32_t if_id = read_u32(b + pos + 8, big_endian);
    uint32_t caplen = read_u32(b + pos + 20, big_endian);
    if (block_type != EPB_TYPE || block_len < EPB_MIN_BYTES || (block_len & 3) ||
        (uint64_t)block_len > (uint64_t)(end - pos) || (uint64_t)if_id >= interfaces ||
        (uint64_t)EPB_HEADER_BYTES + caplen > (uint64_t)block_len - 4)
        return -1;
    return pos + (Py_ssize_t)block_len;
}

/* (offsets, pos) of the walk from pos with `next` (releases view). Two passes over the headers, to count and
 * to fill: the offsets come out in one bytes object of their size. */
static PyObject *walk(Py_buffer *view, Py_ssize_t pos, next_record next, int big_endian, uint64_t interfaces)
{
    const unsigned char *b = view->buf;
    Py_ssize_t end = view->len, count = 0, at = pos, following;
    PyObject *offsets = NULL;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto done;
    }
    while ((following = next(b, at, end, big_endian, interfaces)) >= 0) {
        count++;
        at = following;
    }
    offsets = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (offsets == NULL)
        goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(offsets);
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = (int64_t)pos;
        pos = next(b, pos, end, big_endian, interfaces);
    }
done:
    PyBuffer_Release(view);
    return offsets == NULL ? NULL : Py_BuildValue("(Nn)", offsets, pos);
}

static PyObject *pcap_offsets(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos;
    int big_endian;
    if (!PyArg_ParseTuple(args, "y*np", &view, &pos, &big_endian))
        return NULL;
    return walk(&view, pos, pcap_next, big_endian, 0);
}

static PyObject *epb_offsets(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos;
    int big_endian;
    unsigned long long interfaces;
    if (!PyArg_ParseTuple(args, "y*npK", &view, &pos, &big_endian, &interfaces))
        return NULL;
    return walk(&view, pos, epb_next, big_endian, (uint64_t)interfaces);
}

static PyMethodDef methods[] = {
    {"pcap_offsets", pcap_offsets, METH_VARARGS, "pcap_offsets(buf, pos, big_endian) -> (offsets, pos)"},
    {"epb_offsets", epb_offsets, METH_VARARGS, "epb_offsets(buf, pos, big_endian, interfaces) -> (offsets, pos)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_walk",
    "Where the packet records lying whole in a capture's read buffer start (see record_walk.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__record_walk(void)
{
    return PyModule_Create(&module);
}
