/* ZMTP resynchronisation's search for a frame boundary, compiled: the candidates of a window of captured bytes
 * judged by their framing alone, so that only those the frame validator must vouch for are handed back.
 *
 * dlcsniff.decoders.protocols._zmtp_scan, built by `make setup` (pyproject.toml: ext-modules). The contract is
 * decoders/protocols/zmtp.py's `_ZmtpScanner` (`scan`, `_judge`, `_plausible_header`: the pure-Python twin,
 * fallback and reference the tests hold this to, window by window and on every bundled capture).
 *
 *   scan(window, start, reserved, named, final, reach, validated_bytes, validating)
 *       -> (kind, position, a, b, after)
 *       The first candidate at or after `start` (a flags byte 0x01-0x07, or 0x00 followed by a non-zero byte)
 *       that its framing does not reject:
 *       FOUND (1): believed at position;  NEED (2): a more bytes from position are needed to judge it;
 *       VALIDATE (3): believed once the validator accepts window[a:b], the first frame's body (prefix); after
 *           is then the verdict of the rest of the chain: 1 believed, -n: n bytes from position needed.
 *           A candidate whose chain is rejected anyway is never handed to the validator.
 *       NONE (0): no candidate from start on; position is where the rejected bytes end (a trailing 0x00 is kept
 *           when not final: its size byte may come), a the bytes needed from there (2 or 0).
 *   KNOWN_COMMANDS: the command names a command frame found by scanning must carry.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { NONE = 0, FOUND = 1, NEED = 2, VALIDATE = 3 };
enum { FLAG_MORE = 0x01, FLAG_LONG = 0x02, FLAG_COMMAND = 0x04 };
enum { SHORT_HEADER = 2, LONG_HEADER = 9, CHAIN_FRAMES = 4 };
#define MAX_FRAME_BYTES ((uint64_t)1 << 32)      /* zmtp.py RESYNC_MAX_FRAME_BYTES */

/* zmtp.py _KNOWN_COMMANDS (ZMTP 3.x command names, RFC 23/37 and the mechanisms') */
static const char *const KNOWN[] = {"READY", "ERROR", "HELLO", "WELCOME", "INITIATE", "MESSAGE", "PING", "PONG",
                                    "SUBSCRIBE", "CANCEL", "JOIN", "LEAVE"};
#define KNOWN_COUNT (sizeof(KNOWN) / sizeof(KNOWN[0]))

/* _plausible_header's verdicts */
enum { IMPLAUSIBLE = 0, PLAUSIBLE = 1, SHORT = 2 };

typedef struct {
    int64_t header_size, size, needed;  /* needed: bytes from j the verdict SHORT waits for */
    int is_data;
} Header;

static int known_command(const unsigned char *name, int64_t size)
{
    for (size_t k = 0; k < KNOWN_COUNT; k++)
        if ((int64_t)strlen(KNOWN[k]) == size && memcmp(KNOWN[k], name, (size_t)size) == 0)
            return 1;
    return 0;
}

static int plausible_header(const unsigned char *w, int64_t n, int64_t j, int reserved, int named, Header *h)
{
    if (j >= n) {
        h->needed = 1;
        return SHORT;
    }
    int flags = w[j];
    if (flags & reserved)
        return IMPLAUSIBLE;
    if (flags & FLAG_LONG) {
        if (j + LONG_HEADER > n) {
            h->needed = LONG_HEADER;
            return SHORT;
        }
        uint64_t size = 0;
        for (int k = 1; k < LONG_HEADER; k++)
            size = (size << 8) | w[j + k];
        if (!(size > 255 && size <= MAX_FRAME_BYTES))   /* LONG only above 255, as libzmq writes it */
            return IMPLAUSIBLE;
        h->size = (int64_t)size;
        h->header_size = LONG_HEADER;
    } else {
        if (j + SHORT_HEADER > n) {
            h->needed = SHORT_HEADER;
            return SHORT;
        }
        h->size = w[j + 1];
        h->header_size = SHORT_HEADER;
    }
    if ((flags & FLAG_COMMAND) || named) {
        int64_t body = j + h->header_size;
        if (h->size < 2)
            return IMPLAUSIBLE;
        if (body >= n) {
            h->needed = h->header_size + 1;
            return SHORT;
        }
        int64_t name_size = w[body];
        if (!name_size || name_size >= h->size)
            return IMPLAUSIBLE;
        if (body + 1 + name_size > n) {
            h->needed = h->header_size + 1 + name_size;
            return SHORT;
        }
        if (!known_command(w + body + 1, name_size))
            return IMPLAUSIBLE;
        h->is_data = 0;
        return PLAUSIBLE;
    }
    if (h->size == 0 && !(flags & FLAG_MORE))
        return IMPLAUSIBLE;     /* an empty single-frame message: what runs of zero bytes look like */
    h->is_data = 1;
    return PLAUSIBLE;
}

/* The chain of frame headers from j on (frame `checked` first): 1 believed, 0 rejected, -n: n bytes from i. */
static int64_t chain(const unsigned char *w, int64_t n, int64_t i, int64_t j, int checked, int strong, int reserved,
                     int named, int final, int64_t reach)
{
    Header h;
    for (; checked < CHAIN_FRAMES; checked++) {
        int verdict = plausible_header(w, n, j, reserved, named, &h);
        if (verdict == IMPLAUSIBLE)
            return 0;
        if (verdict == SHORT) {
            if (final || j + h.needed > i + reach)
                return checked >= 2 || strong;
            return -(j + h.needed - i);
        }
        j += h.header_size + h.size;
    }
    return 1;
}

static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer window;
    Py_ssize_t start, reach, validated_bytes;
    int reserved, named, final, validating;
    if (!PyArg_ParseTuple(args, "y*niiinni", &window, &start, &reserved, &named, &final, &reach, &validated_bytes,
                          &validating))
        return NULL;
    const unsigned char *w = window.buf;
    int64_t n = window.len;
    PyObject *result = NULL;
    for (int64_t i = start; i < n; i++) {
        int flags = w[i];
        if (!(flags >= 0x01 && flags <= 0x07) && !(flags == 0 && i + 1 < n && w[i + 1] != 0))
            continue;
        Header h;
        int verdict = plausible_header(w, n, i, reserved, named, &h);
        if (verdict == IMPLAUSIBLE)
            continue;
        if (verdict == SHORT) {
            if (final || i + h.needed > i + reach)
                continue;       /* nothing checked, nothing strong: rejected */
            result = Py_BuildValue("(inLLL)", NEED, (Py_ssize_t)i, (long long)h.needed, 0LL, 0LL);
            break;
        }
        int strong = h.header_size == LONG_HEADER || !h.is_data;
        if (h.is_data && validating) {
            int64_t body = i + h.header_size;
            int64_t end = body + (h.size < validated_bytes ? h.size : validated_bytes);
            if (end > n) {
                if (final)
                    continue;
                result = Py_BuildValue("(inLLL)", NEED, (Py_ssize_t)i, (long long)(end - i), 0LL, 0LL);
                break;
            }
            int64_t after = chain(w, n, i, body + h.size, 1, 1, reserved, named, final, reach);
            if (after == 0)
                continue;       /* rejected whatever the validator says */
            result = Py_BuildValue("(inLLL)", VALIDATE, (Py_ssize_t)i, (long long)body, (long long)end,
                                   (long long)after);
            break;
        }
        int64_t after = chain(w, n, i, i + h.header_size + h.size, 1, strong, reserved, named, final, reach);
        if (after == 0)
            continue;
        if (after > 0)
            result = Py_BuildValue("(inLLL)", FOUND, (Py_ssize_t)i, 0LL, 0LL, 0LL);
        else
            result = Py_BuildValue("(inLLL)", NEED, (Py_ssize_t)i, (long long)-after, 0LL, 0LL);
        break;
    }
    if (result == NULL && !PyErr_Occurred()) {
        int keep = !final && n > 0 && w[n - 1] == 0;
        result = Py_BuildValue("(inLLL)", NONE, (Py_ssize_t)(n - keep), keep ? 2LL : 0LL, 0LL, 0LL);
    }
    PyBuffer_Release(&window);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(window, start, reserved, named, final, reach, validated_bytes, validating) -> (kind, position, a, b, "
     "after)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_zmtp_scan", "ZMTP resynchronisation's candidate search (see decoders/protocols/zmtp.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__zmtp_scan(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *names = PyTuple_New(KNOWN_COUNT);
    if (names == NULL)
        goto fail;
    for (size_t k = 0; k < KNOWN_COUNT; k++) {
        PyObject *name = PyBytes_FromString(KNOWN[k]);
        if (name == NULL) {
            Py_DECREF(names);
            goto fail;
        }
        PyTuple_SET_ITEM(names, k, name);
    }
    if (PyModule_AddObject(m, "KNOWN_COMMANDS", names) < 0) {
        Py_DECREF(names);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
